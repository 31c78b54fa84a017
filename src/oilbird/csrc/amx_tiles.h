// AMX tile plumbing shared by the block kernels on tiles (amx_blocks.cpp: int8; amx_bf16_blocks.cpp:
// bfloat16): the OS grant of the tile state and the tile configuration. Include only where the
// compiler has -mamx-tile.
#pragma once

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace oilbird::amx {

// Ask the kernel for the tile data state (Linux 5.16+): once per process, for every thread.
inline bool tiles_granted() {
  static const bool granted = [] {
    constexpr long kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return granted;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Load `cfg` into the tile configuration. GCC's _tile_loadconfig tells the compiler it reads only
// the struct's first 8 bytes, so the stores of the rows and columns could be dropped before it:
// the barrier makes them happen (without it a refactor ran tile instructions on a garbage
// configuration: SIGILL).
inline void load_config(TileConfig& cfg) {
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

}  // namespace oilbird::amx
