/*
 * tools/cli.h — what every mpengine subcommand shares: its option table, parsing of
 * "--name value", "--name=value" and flags, the --help text, and turning an mp_error into a
 * message on stderr and an exit code (0 success, 1 failure while running, 2 bad usage or input).
 *
 * Only tools/ prints and exits; the library code below it returns mp_status and fills mp_error.
 */
#ifndef MPENGINE_TOOLS_CLI_H
#define MPENGINE_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

enum { CLI_EXIT_OK = 0, CLI_EXIT_FAILURE = 1, CLI_EXIT_USAGE = 2 };

/* Most positional arguments one command takes (`data tokenize FILES...`); a longer list is
 * given as a quoted glob, which the command expands itself. */
enum { CLI_MAX_POSITIONALS = 4096 };

typedef struct {
  const char *name;        /* "seq-len", without the dashes */
  const char *value_name;  /* "S"; NULL for a flag */
  const char *help;        /* one line */
  const char *value;       /* set by cli_parse: the value, or "1" for a flag given; NULL if absent */
} cli_option;

typedef struct {
  const char *command;     /* "describe" */
  const char *usage;       /* "mpengine describe MODEL.json [options]" */
  const char *summary;     /* a paragraph: what it does */
  int min_positionals, max_positionals;
  cli_option *options;     /* terminated by an entry with name NULL */
  const char *positionals[CLI_MAX_POSITIONALS];
  int num_positionals;
  bool help_requested;
} cli_command;

/* Parses argv (argv[0] is the subcommand name). On --help, sets help_requested. Fails with
 * MP_ERR_INPUT on an unknown option (suggesting the closest), a missing value, or the wrong number
 * of positional arguments. */
mp_status cli_parse(cli_command *command, int argc, char **argv, mp_error *err);

void cli_print_help(const cli_command *command);

/* The value of an option, or NULL when absent. */
const char *cli_value(const cli_command *command, const char *name);
bool cli_flag(const cli_command *command, const char *name);

/* Parses an option's value as an integer >= min_value; default_value when absent. */
mp_status cli_int(const cli_command *command, const char *name, int64_t min_value,
                  int64_t default_value, int64_t *out, mp_error *err);

/* Prints "mpengine <command>: <message>" and a hint for usage errors; returns the exit code. */
int cli_report(const cli_command *command, const mp_error *err);

/* Parses argv, prints help when asked; returns -1 to continue, or the exit code to return now. */
int cli_begin(cli_command *command, int argc, char **argv);

/* Seconds on the monotonic clock, for the commands' timings. */
double cli_now_seconds(void);

#endif /* MPENGINE_TOOLS_CLI_H */
