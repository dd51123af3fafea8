// Host-side probe of wgmma_ws.cuh's plans for tests/test_wgmma_plans.py: split_k_slices, ws_small_slabs,
// ws_rows_by_cost and ws_split_head on a device described by its SM count and cluster rooms. No GPU and no CUDA call:
// nvcc only for the headers. One query a run, its answer on stdout:
//   probe split BLOCKS TILES SM WANTED ROOMS           -> slices (WANTED 0: the plan's own)
//   probe slabs ROWS N K SM T32_1 T32_2 T64_1 T64_2 ROOMS -> 1 or 2
//   probe rows M N K SM T192 T256 ROOMS                 -> the rows of the tile by cost
//   probe head M N K SM T192 T256 ROOMS                 -> the first launch's rows (0: one launch)
// ROOMS: the blocks that clusters of 2, 3, ..., 8 hold at once, comma-separated (one room for every tile).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/wgmma_ws.cuh"

using namespace bitcompile::cuda;

namespace {

ClusterRoom parse_rooms(const char* text) {
  ClusterRoom room;
  for (int i = 0; i < ClusterRoom::kLargest - 1 && *text; ++i) {
    char* end = nullptr;
    room.blocks[i] = std::strtoll(text, &end, 10);
    text = *end == ',' ? end + 1 : end;
  }
  return room;
}

long long arg(char** argv, int i) { return std::atoll(argv[i]); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const char* query = argv[1];
  if (!std::strcmp(query, "split") && argc == 7) {
    const ClusterRoom room = parse_rooms(argv[6]);
    std::printf("%lld\n", static_cast<long long>(split_k_slices(arg(argv, 2), arg(argv, 3), static_cast<int>(arg(argv, 4)),
                                                                room, static_cast<int>(arg(argv, 5)))));
    return 0;
  }
  if (!std::strcmp(query, "slabs") && argc == 11) {
    const ClusterRoom room = parse_rooms(argv[10]);
    const WsSmallTimes times{std::atof(argv[6]), std::atof(argv[7]), std::atof(argv[8]), std::atof(argv[9])};
    std::printf("%d\n", ws_small_slabs(static_cast<int>(arg(argv, 2)), arg(argv, 3), arg(argv, 4),
                                       static_cast<int>(arg(argv, 5)), room, room, times));
    return 0;
  }
  if ((!std::strcmp(query, "rows") || !std::strcmp(query, "head")) && argc == 9) {
    const ClusterRoom room = parse_rooms(argv[8]);
    const WsRooms rooms{room, room, room};
    const WsBlockTimes times{std::atof(argv[6]), std::atof(argv[7])};
    const long long m = arg(argv, 2), n = arg(argv, 3), k = arg(argv, 4);
    const int sm = static_cast<int>(arg(argv, 5));
    if (query[0] == 'r') {
      std::printf("%d\n", ws_rows_by_cost(m, n, k, sm, rooms, times));
    } else {
      std::printf("%lld\n", static_cast<long long>(ws_split_head(m, n, k, sm, rooms, times)));
    }
    return 0;
  }
  std::fprintf(stderr, "unknown query or wrong arguments\n");
  return 2;
}
