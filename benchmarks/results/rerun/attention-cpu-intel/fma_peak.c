// AVX-512 FMA peak of one core: 12 independent accumulator chains (covers 4-cycle latency x 2 ports + margin).
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
int main(void) {
  __m512 a[12], b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
  long n = 200000000;
  for (int rep = 0; rep < 3; rep++) {
    struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long k = 0; k < n; k++)
      for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    float sum = 0; for (int i = 0; i < 12; i++) sum += _mm512_reduce_add_ps(a[i]);
    printf("%.1f GFLOP/s one core (%g)\n", n * 12.0 * 32 / s / 1e9, sum);
  }
  return 0;
}
