/* Evict one address range from every cache level (benchmarks/infllmv2.py's default flush: the
 * KV a decode step reads comes from DRAM while the interpreter, the kernel's code and its
 * workspace stay as warm as they are in a model's decode loop).
 *
 * ark_evict(p, bytes): clflushopt (clflush where the CPU lacks it) on every 64-byte line of
 * [p, p + bytes), then a store fence so the evictions are done before the caller times a read. */
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>

__attribute__((target("clflushopt"))) static void evict_opt(const char *p, const char *end) {
    for (; p < end; p += 64) _mm_clflushopt((void *)p);
}

static void evict_plain(const char *p, const char *end) {
    for (; p < end; p += 64) _mm_clflush(p);
}

static int has_clflushopt(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b >> 23 & 1);
}

void ark_evict(const char *p, int64_t bytes) {
    static int opt = -1;
    if (opt < 0) opt = has_clflushopt();
    const char *start = (const char *)((uintptr_t)p & ~(uintptr_t)63), *end = p + bytes;
    if (opt) evict_opt(start, end);
    else evict_plain(start, end);
    _mm_mfence();
}
