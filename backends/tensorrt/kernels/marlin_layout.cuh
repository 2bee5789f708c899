// Where each 4-bit code of a Marlin-packed weight lives (quant/formats/marlin.py is the reference).
//
// B int32 [k/16, 2n]: row tk holds the 16 k-rows tk*16 .. tk*16+15 of every column. Within a row,
// each run of 128 words (1024 codes) is one "chunk" covering 64 columns (4 tiles of 16x16); code u
// (bits 4u..4u+3) of word w of a chunk is PERM[8w + u] of the chunk's tiled order. Unrolling
// marlin.py's PERM formula gives, for word w (0..127):
//     j = w % 4 (tile in the chunk), col = w / 16, base = 2 * ((w / 4) % 4)
//     column  = 16 j + col      for codes 0,1,4,5;   16 j + col + 8 for codes 2,3,6,7
//     k-row   = base, base + 8, base, base + 8, base + 1, base + 9, base + 1, base + 9   (u = 0..7)
// so every word holds 2 columns x 4 k-rows of one 16-row tile. Codes are unsigned, zero point 8.
//
// s fp16 [groups, n]: grouped (group_size < k): runs of 64 gathered through SCALE_PERM (an 8x8
// transpose); per-channel: runs of 32 gathered through SCALE_PERM_SINGLE.
#pragma once

#ifdef __CUDACC__
#define ARK_HD __host__ __device__ __forceinline__
#else
#define ARK_HD inline
#endif

namespace arkinfer {

// k-row (0..15) of code u of word w within its 16-row tile.
ARK_HD int marlin_code_row(int w, int u) {
  const int base = 2 * ((w >> 2) & 3);
  return base + ((u >> 2) & 1) + 8 * (u & 1);
}

// Column (0..63) inside the word's 64-column chunk of code u of word w.
ARK_HD int marlin_code_col(int w, int u) {
  return 16 * (w & 3) + (w >> 4) + 8 * ((u >> 1) & 1);
}

// Index into s (flattened [groups, n]) of the scale of (group g, column c).
ARK_HD long long marlin_scale_index(int g, int c, int n, bool grouped) {
  if (grouped) {
    const int o = c & 63;  // position in the run of 64; SCALE_PERM is its own inverse
    return (long long)g * n + (c - o) + (o & 7) * 8 + (o >> 3);
  }
  const int o = c & 31;
  const int i = (o & 7) >> 1;
  const int jj = o - 2 * i;                 // one of 0,1,8,9,16,17,24,25
  return (long long)(c - o) + i * 8 + (jj >> 3) * 2 + (jj & 1);
}

}  // namespace arkinfer
