/*
 * tools/cmd_pending.c — subcommands whose capability has not landed yet.
 *
 * Each still parses --help, so the whole command line is discoverable today, and otherwise says
 * plainly which issue brings it and exits 2. A subcommand moves to its own cmd_<name>.c file when
 * its issue lands.
 */
#include <stdio.h>

#include "tools/cli.h"
#include "tools/commands.h"

static int pending(int argc, char **argv, const char *usage, const char *summary,
                   const char *arrives_with) {
  cli_option no_options[] = {{0}};
  cli_command command = {.command = argv[0], .usage = usage, .summary = summary,
                         .min_positionals = 0, .max_positionals = 8, .options = no_options};
  mp_error err = MP_ERROR_INITIALIZER;
  /* Options are not known yet: only --help is honoured, everything else is reported below. */
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-' && (argv[i][1] == 'h' || (argv[i][1] == '-' && argv[i][2] == 'h'))) {
      cli_print_help(&command);
      printf("\nnot implemented yet: %s.\n", arrives_with);
      return CLI_EXIT_OK;
    }
  }
  mp_fail(&err, MP_ERR_INPUT, "not implemented yet: %s", arrives_with);
  return cli_report(&command, &err);
}

int cmd_timeline(int argc, char **argv) {
  return pending(argc, argv,
                 "mpengine timeline TRACE.json [--against PLAN.json] [--format ascii|svg|chrome] "
                 "[--out FILE]",
                 "Show what a run really did, and against its plan where the prediction was "
                 "wrong.",
                 "the measured timeline (issue 10)");
}
