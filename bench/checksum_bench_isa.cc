// XXH3 built for one instruction set each (libxxhash-dev's xxhash.h inlined,
// XXH_VECTOR fixed per translation unit; bench/CMakeLists.txt compiles this
// file once per PACER_XXH3_ISA): what a CPU without AVX-512 runs.
#define XXH_INLINE_ALL
#define XXH_VECTOR PACER_XXH3_VECTOR
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

uint64_t PACER_XXH3_FN(const void* data, size_t size) { return XXH3_64bits(data, size); }
