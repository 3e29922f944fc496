// AMX, Intel's matrix unit: eight tile registers of up to 16 rows x 64 bytes,
// and dot products of whole tiles (int8 or bfloat16 pairs into int32 or float32
// sums). bf16_linear.cpp's `bf16-amx` path and block_linear.cpp's tiles use it.
//
// Linux gives a process the tiles' 8 KiB of register state only after the
// process asks for it (arch_prctl ARCH_REQ_XCOMP_PERM), once; a tile
// instruction before that dies with SIGILL. `amx_tiles` asks on first use and
// says whether it was granted (false in a build without AMX; quantization.py
// refuses `bf16-amx` then), and `amx_configure`, which exists only in a build
// with AMX, loads one thread's tile shapes (a thread's tile configuration is its
// own, so each OpenMP thread loads it before its first tile instruction).

#include <torch/extension.h>

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__x86_64__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace amity {

bool amx_tiles() {
#if defined(__AMX_TILE__) && defined(__x86_64__)
  constexpr int kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
  constexpr int kTileData = 18;               // XFEATURE_XTILEDATA
  static const bool granted = syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  return granted;
#else
  return false;
#endif
}

#if defined(__AMX_TILE__) && defined(__x86_64__)
// Tile t: rows[t] rows of colsb[t] bytes, for t < count (the rest unused).
void amx_configure(int count, const uint8_t* rows, const uint16_t* colsb) {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < count; ++t) config.rows[t] = rows[t], config.colsb[t] = colsb[t];
  // gcc does not model ldtilecfg as reading `config`: at -O2 it dropped the stores of
  // a constant configuration (a standalone test: tiles of 0 rows, then SIGILL).
  asm volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}
#endif

}  // namespace amity

TORCH_LIBRARY_FRAGMENT(amity, m) {
  m.def("amx_tiles() -> bool", &amity::amx_tiles);
}
