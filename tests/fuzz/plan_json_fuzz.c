/* tests/fuzz/plan_json_fuzz.c — libFuzzer target: parallelism plans (mp_plan_parse_text); every
 * plan it accepts is written by mp_plan_to_json (the plan file's and a checkpoint manifest's one
 * writer) and must read back by mp_plan_parse_json as the same plan. */
#include "tests/fuzz/fuzz_util.h" /* first: it defines _GNU_SOURCE for memfd_create */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "topology/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text_copy(data, size);
  if (text == NULL) return 0;
  mp_error err = MP_ERROR_INITIALIZER;
  /* mp_plan is large (two 1024-entry arrays); keep it off the stack. */
  mp_plan *plan = malloc(sizeof *plan);
  if (plan != NULL) {
    if (mp_plan_parse_text(text, "plans/fuzz.json", "plans", plan, &err) == MP_OK) {
      volatile double sink = mp_training_learning_rate(&plan->training, 0) +
                             mp_training_learning_rate(&plan->training, plan->training.steps - 1);
      (void)sink;
      mp_plan *back = malloc(sizeof *back);
      cJSON *object = mp_plan_to_json(plan, NULL);
      if (back != NULL && object != NULL) {
        if (mp_plan_parse_json(object, plan->source, NULL, back, &err) != MP_OK ||
            memcmp(back, plan, sizeof *plan) != 0) {
          abort(); /* the writer wrote what its reader refuses, or another plan */
        }
      }
      cJSON_Delete(object);
      free(back);
    } else if (err.message[0] == '\0') {
      abort();
    }
    free(plan);
  }
  free(text);
  return 0;
}
