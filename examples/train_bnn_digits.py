"""Train a binary CNN on scikit-learn's 8x8 handwritten digits, compiled with bitcompile, then deploy it.

    pip install scikit-learn
    python examples/train_bnn_digits.py                 # about a minute on a laptop CPU
    python examples/train_bnn_digits.py --inner inductor --epochs 20
    python examples/train_bnn_digits.py --tiny          # a seconds-long smoke run (no accuracy target)

What it shows:
- a binary neural network written with bitcompile.nn layers (BinaryConv2d, BinaryLinear, with
  BatchNorm), keeping the first conv and the last linear layer in float (usual BNN practice);
- training it under torch.compile(model, backend="bitcompile"): the binary layers run on the
  bit-packed kernels forward and get straight-through-estimator gradients backward;
- compiled inference (packed weights) agreeing with eager PyTorch;
- bitcompile.explain: which layers the backend rewrote;
- torch.export + bitcompile.lower: a deployable program whose binary weights are stored packed,
  saved with torch.export.save, smaller on disk, and giving the same predictions once loaded.

The data set ships inside scikit-learn (1797 images, 8x8, 10 classes): nothing is downloaded.
"""

import argparse
import os
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import bitcompile
from bitcompile.nn import BinaryConv2d, BinaryLinear


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=64, help="channels of the binary convolutions")
    parser.add_argument("--inner", default="aot_eager", choices=["aot_eager", "inductor", "eager"],
                        help="compiler for the non-binary rest of the graph (aot_eager compiles fastest on CPU)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="a seconds-long smoke run: 1 epoch, narrow model")
    args = parser.parse_args()
    if args.tiny:
        args.epochs, args.width = 1, 32
    return args


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------
def load_digits_tensors(device, seed):
    """(x_train, y_train, x_test, y_test): images [N, 1, 8, 8] normalized, labels [N]; 80/20 split."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    images, labels = images[order], labels[order]
    split = int(0.8 * len(labels))
    mean, std = images[:split].mean(), images[:split].std()
    images = (images - mean) / std
    return (images[:split].to(device), labels[:split].to(device),
            images[split:].to(device), labels[split:].to(device))


# ------------------------------------------------------------------------------------------------
# Model
# ------------------------------------------------------------------------------------------------
class BinaryDigitsNet(nn.Module):
    """float conv -> 2 x (binary conv, BN, max-pool) -> binary linear, BN -> float linear."""

    def __init__(self, width=64, hidden=256, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width))
        self.block1 = nn.Sequential(BinaryConv2d(width, width, 3, padding=1), nn.BatchNorm2d(width),
                                    nn.MaxPool2d(2))                                      # 8x8 -> 4x4
        self.block2 = nn.Sequential(BinaryConv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width),
                                    nn.MaxPool2d(2))                                      # 4x4 -> 2x2
        self.fc1 = nn.Sequential(BinaryLinear(2 * width * 2 * 2, hidden), nn.BatchNorm1d(hidden))
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.block1(x)
        x = self.block2(x)
        x = self.fc1(x.flatten(1))
        return self.head(x)


# ------------------------------------------------------------------------------------------------
# Training and evaluation
# ------------------------------------------------------------------------------------------------
def train(compiled, model, data, args):
    x_train, y_train, _, _ = data
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    steps_per_epoch = (len(y_train) + args.batch_size - 1) // args.batch_size
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, epochs=args.epochs,
                                                    steps_per_epoch=steps_per_epoch)
    for epoch in range(1, args.epochs + 1):
        model.train()
        start = time.perf_counter()
        order = torch.randperm(len(y_train), device=y_train.device)
        total_loss, correct = 0.0, 0
        for i in range(0, len(y_train), args.batch_size):
            batch = order[i:i + args.batch_size]
            logits = compiled(x_train[batch])
            loss = F.cross_entropy(logits, y_train[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total_loss += loss.item() * len(batch)
            correct += (logits.argmax(1) == y_train[batch]).sum().item()
        seconds = time.perf_counter() - start
        print(f"epoch {epoch:2d}/{args.epochs}  loss {total_loss / len(y_train):.4f}  "
              f"train acc {100 * correct / len(y_train):5.1f}%  time {seconds:5.1f}s", flush=True)


@torch.no_grad()
def predict(fn, x):
    return fn(x)


def accuracy(logits, labels):
    return (logits.argmax(1) == labels).float().mean().item()


def file_size(path):
    return os.path.getsize(path) / 1024


# ------------------------------------------------------------------------------------------------
def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    data = load_digits_tensors(device, args.seed)
    x_train, y_train, x_test, y_test = data
    print(f"digits: {len(y_train)} train / {len(y_test)} test images, device {device}, inner compiler {args.inner}")

    model = BinaryDigitsNet(width=args.width).to(device)
    compiled = torch.compile(model, backend="bitcompile", options={"inner": args.inner})

    # 1. Train under torch.compile: the binary layers run on bitcompile's kernels with STE gradients.
    start = time.perf_counter()
    train(compiled, model, data, args)
    train_seconds = time.perf_counter() - start

    # 2. Inference: compiled (packed weights) against eager PyTorch on the same trained model.
    model.eval()
    eager_logits = predict(model, x_test)
    compiled_logits = predict(compiled, x_test)
    test_acc = accuracy(compiled_logits, y_test)
    same_predictions = torch.equal(eager_logits.argmax(1), compiled_logits.argmax(1))
    max_diff = (eager_logits - compiled_logits).abs().max().item()
    logits_close = torch.allclose(compiled_logits, eager_logits, rtol=1e-4, atol=1e-4)
    print(f"test accuracy: {100 * test_acc:.1f}% (compiled), {100 * accuracy(eager_logits, y_test):.1f}% (eager)")
    print(f"compiled and eager inference agree: same predictions {same_predictions}, "
          f"max |logit difference| {max_diff:.2e}")

    # 3. What the backend rewrote (inference graph: explain under no_grad).
    with torch.no_grad():
        print(bitcompile.explain(model, x_test[:8]))

    # 4. Deploy: torch.export, lower to packed weights, save both, load the lowered one back.
    # clone(): the example input is saved with the program, and a slice would save its whole storage.
    example = x_test[:8].clone()
    batch = torch.export.Dim("batch")
    exported = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
    lowered = bitcompile.lower(exported)
    with tempfile.TemporaryDirectory() as folder:
        float_path = os.path.join(folder, "digits_float.pt2")
        lowered_path = os.path.join(folder, "digits_lowered.pt2")
        torch.export.save(exported, float_path)
        torch.export.save(lowered, lowered_path)
        float_kib, lowered_kib = file_size(float_path), file_size(lowered_path)
        loaded = torch.export.load(lowered_path).module()
    loaded_logits = predict(loaded, x_test)
    loaded_same = torch.equal(loaded_logits.argmax(1), eager_logits.argmax(1))
    print(f"exported program: {float_kib:.1f} KiB float, {lowered_kib:.1f} KiB lowered "
          f"({float_kib / lowered_kib:.1f}x smaller)")
    print(f"loaded lowered program: same predictions as eager {loaded_same}, "
          f"max |logit difference| {(loaded_logits - eager_logits).abs().max().item():.2e}")

    print("\nsummary")
    print(f"  trained {args.epochs} epochs in {train_seconds:.1f}s under torch.compile(backend='bitcompile')")
    print(f"  test accuracy {100 * test_acc:.1f}%")
    print(f"  compiled vs eager: {'agree' if same_predictions and logits_close else 'DISAGREE'}")
    print(f"  lowered program {lowered_kib:.1f} KiB vs {float_kib:.1f} KiB float; "
          f"loaded program {'agrees' if loaded_same else 'DISAGREES'}")
    if not (same_predictions and logits_close and loaded_same):
        raise SystemExit("compiled, eager and lowered models disagree")
    if not args.tiny and test_acc < 0.90:
        raise SystemExit(f"test accuracy {100 * test_acc:.1f}% is below the 90% target")


if __name__ == "__main__":
    main()
