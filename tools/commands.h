/*
 * tools/commands.h — the subcommands of `mpengine`, one file each (cmd_<name>.c).
 *
 * Each takes argv with argv[0] = its own name and returns the process exit code:
 * 0 success, 1 failure while running, 2 bad usage or bad input.
 */
#ifndef MPENGINE_TOOLS_COMMANDS_H
#define MPENGINE_TOOLS_COMMANDS_H

int cmd_bench(int argc, char **argv);
int cmd_bench_comm(int argc, char **argv); /* `bench comm`: argv[0] = "comm" */
int cmd_data(int argc, char **argv);
int data_tokenize(int argc, char **argv); /* `data tokenize`: argv[0] = "tokenize" */
int data_decode(int argc, char **argv);   /* `data decode`: argv[0] = "decode" */
int cmd_describe(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_import(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_schedule(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_timeline(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_version(int argc, char **argv);

#endif /* MPENGINE_TOOLS_COMMANDS_H */
