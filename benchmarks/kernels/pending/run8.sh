timeout 120 python benchmarks/kernels/pending/planes_in_producer.py --device cuda > $OUT/planes_producer.txt 2>&1; tail -6 $OUT/planes_producer.txt
bash benchmarks/gpu_session.sh build decode 2>&1 | grep -v "^ " | tail -14
TESTS="apot and cuda" timeout 200 bash benchmarks/gpu_session.sh tests 2>&1 | tail -4
