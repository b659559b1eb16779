/* tests/fuzz/model_json_fuzz.c — libFuzzer target: model descriptions (mp_model_parse_text),
 * then what `mpengine describe` computes from them at once (topology/layer_cost.h): model.c
 * bounds every size so that those counts cannot overflow, and UBSan checks the promise. */
#include "tests/fuzz/fuzz_util.h" /* first: it defines _GNU_SOURCE for memfd_create */

#include <stdint.h>
#include <stdlib.h>

#include "topology/layer_cost.h"
#include "topology/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text_copy(data, size);
  if (text == NULL) return 0;
  mp_error err = MP_ERROR_INITIALIZER;
  mp_model *model = NULL;
  if (mp_model_parse_text(text, "fuzz.json", &model, &err) == MP_OK) {
    /* Walk what the parser promised: every layer is reachable and named. */
    volatile size_t sum = 0;
    for (int i = 0; i < mp_model_num_layers(model); ++i) {
      const mp_layer_spec *layer = mp_model_layer(model, i);
      if (layer == NULL) abort();
      sum += (size_t)layer->hidden + strlen(layer->name);
    }
    (void)sum;
    const mp_cost_shape shape = {1, mp_model_seq_len(model), 2, false, 1, 1};
    for (int i = 0; i < mp_model_num_layers(model); ++i) {
      mp_layer_cost cost;
      mp_layer_cost_compute(mp_model_layer(model, i), &shape, &cost);
    }
    volatile int64_t params = mp_model_params(model);
    (void)params;
    (void)mp_model_num_transformer_layers(model);
    mp_model_free(model);
  } else if (model != NULL || err.message[0] == '\0') {
    abort(); /* a failure must leave *out NULL and say why */
  }
  free(text);
  return 0;
}
