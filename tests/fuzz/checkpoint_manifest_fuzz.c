/* tests/fuzz/checkpoint_manifest_fuzz.c — libFuzzer target: checkpoint manifests
 * (mp_checkpoint_manifest_check_text: the manifest checks of a load, without the shard files; the
 * "plan" object in either form, the plan file's through topology/plan.c's reader, or the flat one
 * of earlier manifests). */
#include "tests/fuzz/fuzz_util.h" /* first: it defines _GNU_SOURCE for memfd_create */

#include <stdint.h>
#include <stdlib.h>

#include "engine/checkpoint/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text_copy(data, size);
  if (text == NULL) return 0;
  mp_error err = MP_ERROR_INITIALIZER;
  if (mp_checkpoint_manifest_check_text(text, "ckpt/step-1/manifest.json", &err) != MP_OK &&
      err.message[0] == '\0') {
    abort(); /* a refusal must say why */
  }
  free(text);
  return 0;
}
