#include "zz_scratch/commands.h"
int main(int argc, char **argv) { return cmd_bench_comm(argc - 1, argv + 1); }
