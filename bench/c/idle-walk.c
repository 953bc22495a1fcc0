// The C side of bench/idle-penalty.mjs: reads one byte of every 64-byte line of a KB-sized buffer (touched once
// first), once right after the previous walk and once after each pause, and prints how long each walk took:
//   idle-walk KB ROUNDS PAUSE_MS...   ->   one line per pause: "PAUSE_MS us us us ..." (ROUNDS walks each)
// A pause of 0 is the warm walk: right after another one.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static unsigned walk(volatile unsigned char *buf, size_t lines) {
  unsigned sum = 0;
  for (size_t i = 0; i < lines; i++) sum += buf[i * 64];
  return sum;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: idle-walk KB ROUNDS PAUSE_MS...\n");
    return 2;
  }
  size_t kb = strtoul(argv[1], NULL, 10);
  int rounds = atoi(argv[2]);
  size_t lines = kb * 1024 / 64;
  volatile unsigned char *buf = malloc(kb * 1024);
  if (!buf || rounds < 1) return 2;
  for (size_t i = 0; i < kb * 1024; i++) buf[i] = (unsigned char)i;
  unsigned sink = 0;
  for (int a = 3; a < argc; a++) {
    long pause = strtol(argv[a], NULL, 10);
    printf("%ld", pause);
    for (int r = 0; r < rounds; r++) {
      if (pause > 0) usleep(pause * 1000);
      else sink += walk(buf, lines);
      double t = now_us();
      sink += walk(buf, lines);
      printf(" %.2f", now_us() - t);
    }
    printf("\n");
  }
  return sink == 1 ? 1 : 0;
}
