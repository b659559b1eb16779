/*
 * tools/bench/markov_build.c — how long the synthetic source takes to build for a GPT-2 sized
 * vocabulary (50257 tokens, 4 successors each): `run` without --data and `data synth` build it
 * before their first step, so it is start-up time a user waits for. Prints the time of each
 * build and the best; the chain's entropy rate is printed too, so a fast build of a wrong chain
 * shows. The unit test (tests/engine/markov_source_test.cc) checks the chain, not the clock:
 * timing on a shared CI machine is noise.
 *
 * usage: bazel run //tools/bench:markov_build -- [VOCAB [SUCCESSORS [ROUNDS]]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "engine/data/markov_source.h"

static double now_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  long vocab = argc > 1 ? atol(argv[1]) : 50257;
  int successors = argc > 2 ? atoi(argv[2]) : 4;
  int rounds = argc > 3 ? atoi(argv[3]) : 5;
  if (rounds < 1) rounds = 1;
  printf("%8s %10s %6s %12s %14s\n", "vocab", "successors", "round", "build_s", "entropy_rate");
  double best = -1;
  for (int r = 0; r < rounds; ++r) {
    mp_markov_source *source = NULL;
    mp_error err = MP_ERROR_INITIALIZER;
    double start = now_seconds();
    if (mp_markov_source_build(vocab, successors, 1337, &source, &err) != MP_OK) {
      fprintf(stderr, "markov_build: %s\n", err.message);
      return 2;
    }
    double seconds = now_seconds() - start;
    if (best < 0 || seconds < best) best = seconds;
    printf("%8ld %10d %6d %12.4f %14.6f\n", vocab, successors, r, seconds,
           mp_markov_source_entropy_rate(source));
    mp_markov_source_free(source);
  }
  printf("best of %d: %.4f s\n", rounds, best);
  return 0;
}
