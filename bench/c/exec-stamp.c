// The emulator of bench/vmwrapper-start.mjs's start-at figures: prints CLOCK_MONOTONIC in nanoseconds, the moment it
// runs (vmwrapper's execve is done), and exits. Node's process.hrtime.bigint() reads the same clock.
#include <stdio.h>
#include <time.h>

int main(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  printf("%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
  return 0;
}
