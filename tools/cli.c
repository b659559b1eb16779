/* tools/cli.c — option parsing and error reporting shared by the subcommands; see cli.h. */
#include "tools/cli.h"

#include <time.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_reader.h"

static cli_option *find_option(cli_command *command, const char *name, size_t name_length) {
  for (cli_option *option = command->options; option != NULL && option->name != NULL; ++option) {
    if (strlen(option->name) == name_length && strncmp(option->name, name, name_length) == 0) {
      return option;
    }
  }
  return NULL;
}

static mp_status unknown_option(cli_command *command, const char *arg, mp_error *err) {
  const char *names[64];
  int count = 0;
  for (cli_option *option = command->options; option != NULL && option->name != NULL &&
                                              count < 63; ++option) {
    names[count++] = option->name;
  }
  names[count++] = "help";
  names[count] = NULL;
  char bare[64];
  snprintf(bare, sizeof bare, "%s", arg + 2);
  char *equals = strchr(bare, '=');
  if (equals != NULL) *equals = '\0';
  const char *closest = mp_closest_word(bare, names);
  if (closest != NULL) {
    return mp_fail(err, MP_ERR_INPUT, "unknown option '%s'; did you mean '--%s'?", arg, closest);
  }
  return mp_fail(err, MP_ERR_INPUT, "unknown option '%s'", arg);
}

mp_status cli_parse(cli_command *command, int argc, char **argv, mp_error *err) {
  command->num_positionals = 0;
  command->help_requested = false;
  for (int i = 1; i < argc; ++i) {
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      command->help_requested = true;
      return MP_OK;
    }
    if (strncmp(arg, "--", 2) == 0 && arg[2] != '\0') {
      const char *name = arg + 2;
      const char *equals = strchr(name, '=');
      size_t name_length = equals ? (size_t)(equals - name) : strlen(name);
      cli_option *option = find_option(command, name, name_length);
      if (option == NULL) return unknown_option(command, arg, err);
      if (option->value_name == NULL) {
        if (equals != NULL) {
          return mp_fail(err, MP_ERR_INPUT, "option '--%s' takes no value", option->name);
        }
        option->value = "1";
      } else if (equals != NULL) {
        option->value = equals + 1;
      } else {
        if (i + 1 >= argc) {
          return mp_fail(err, MP_ERR_INPUT, "option '--%s' needs a value (%s)", option->name,
                         option->value_name);
        }
        option->value = argv[++i];
      }
      continue;
    }
    if (arg[0] == '-' && arg[1] != '\0') {
      return mp_fail(err, MP_ERR_INPUT, "unknown option '%s' (options are spelled --name)", arg);
    }
    if (command->num_positionals >= CLI_MAX_POSITIONALS) {
      return mp_fail(err, MP_ERR_INPUT,
                     "more than %d arguments: pass a quoted glob ('data/*.txt') instead, which "
                     "mpengine expands itself",
                     CLI_MAX_POSITIONALS);
    }
    if (command->num_positionals >= command->max_positionals) {
      return mp_fail(err, MP_ERR_INPUT, "unexpected argument '%s' (usage: %s)", arg,
                     command->usage);
    }
    command->positionals[command->num_positionals++] = arg;
  }
  if (command->num_positionals < command->min_positionals) {
    return mp_fail(err, MP_ERR_INPUT, "missing argument (usage: %s)", command->usage);
  }
  return MP_OK;
}

void cli_print_help(const cli_command *command) {
  printf("usage: %s\n\n%s\n", command->usage, command->summary);
  if (command->options != NULL && command->options->name != NULL) printf("\noptions:\n");
  for (const cli_option *option = command->options; option != NULL && option->name != NULL;
       ++option) {
    char left[64];
    if (option->value_name != NULL) {
      snprintf(left, sizeof left, "--%s %s", option->name, option->value_name);
    } else {
      snprintf(left, sizeof left, "--%s", option->name);
    }
    printf("  %-26s %s\n", left, option->help);
  }
  printf("  %-26s %s\n", "--help", "show this text");
}

const char *cli_value(const cli_command *command, const char *name) {
  for (const cli_option *option = command->options; option != NULL && option->name != NULL;
       ++option) {
    if (strcmp(option->name, name) == 0) return option->value;
  }
  return NULL;
}

bool cli_flag(const cli_command *command, const char *name) {
  return cli_value(command, name) != NULL;
}

mp_status cli_int(const cli_command *command, const char *name, int64_t min_value,
                  int64_t default_value, int64_t *out, mp_error *err) {
  const char *text = cli_value(command, name);
  if (text == NULL) {
    *out = default_value;
    return MP_OK;
  }
  char *end = NULL;
  errno = 0;
  long long value = strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') {
    return mp_fail(err, MP_ERR_INPUT, "--%s: expected an integer, got '%s'", name, text);
  }
  if (value < min_value) {
    return mp_fail(err, MP_ERR_INPUT, "--%s: must be at least %lld, got %lld", name,
                   (long long)min_value, value);
  }
  *out = value;
  return MP_OK;
}

int cli_report(const cli_command *command, const mp_error *err) {
  if (err->status == MP_OK) return CLI_EXIT_OK;
  fprintf(stderr, "mpengine %s: %s\n", command->command, err->message);
  if (err->status == MP_ERR_INPUT && strstr(err->message, "option") != NULL) {
    fprintf(stderr, "run 'mpengine %s --help' for the options\n", command->command);
  }
  return err->status == MP_ERR_INPUT ? CLI_EXIT_USAGE : CLI_EXIT_FAILURE;
}

int cli_begin(cli_command *command, int argc, char **argv) {
  mp_error err = MP_ERROR_INITIALIZER;
  if (cli_parse(command, argc, argv, &err) != MP_OK) return cli_report(command, &err);
  if (command->help_requested) {
    cli_print_help(command);
    return CLI_EXIT_OK;
  }
  return -1;
}

double cli_now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
