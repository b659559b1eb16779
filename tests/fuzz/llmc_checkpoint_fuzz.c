/*
 * tests/fuzz/llmc_checkpoint_fuzz.c — libFuzzer target: llm.c GPT-2 checkpoints
 * (mp_llmc_load: the 256 x int32 header and the fp32 or bf16 payload), through a
 * memfd.
 *
 * The input is loaded into two tiny layouts: one llm.c can describe (L = 1, C = 4, 1 head,
 * ffn 16, vocab 10 padded to 64, 4 positions: 524 parameters, so a whole valid file is 3120
 * bytes in fp32 and 2072 in bf16) and one it cannot (ffn_hidden != 4 x hidden).
 */
#include "tests/fuzz/fuzz_util.h" /* first: it defines _GNU_SOURCE for memfd_create */

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/model/param_layout.h"
#include "engine/weights/llmc_file.h"
#include "topology/model.h"

static const char *const kModels[2] = {
    "{\"name\": \"fuzz-llmc\", \"vocab_size\": 10, \"seq_len\": 4, \"layers\": ["
    "{\"type\": \"embedding\", \"hidden\": 4, \"max_positions\": 4},"
    "{\"type\": \"transformer\", \"hidden\": 4, \"heads\": 1},"
    "{\"type\": \"layernorm\", \"hidden\": 4},"
    "{\"type\": \"lm_head\", \"hidden\": 4}]}",
    "{\"name\": \"fuzz-ffn\", \"vocab_size\": 10, \"seq_len\": 4, \"layers\": ["
    "{\"type\": \"embedding\", \"hidden\": 4, \"max_positions\": 4},"
    "{\"type\": \"transformer\", \"hidden\": 4, \"heads\": 2, \"ffn_hidden\": 8},"
    "{\"type\": \"layernorm\", \"hidden\": 4},"
    "{\"type\": \"lm_head\", \"hidden\": 4}]}",
};

static mp_param_layout *g_layouts[2];
static float *g_params[2];

/* Builds the layouts once; aborts if the fixed models stop parsing (a broken harness). */
static void setup(void) {
  if (g_layouts[0] != NULL) return;
  for (int i = 0; i < 2; ++i) {
    mp_error err = MP_ERROR_INITIALIZER;
    mp_model *model = NULL;
    if (mp_model_parse_text(kModels[i], "fuzz-model.json", &model, &err) != MP_OK) abort();
    if (mp_param_layout_create(model, 4, &g_layouts[i], &err) != MP_OK) abort();
    mp_model_free(model);
    g_params[i] = calloc(mp_param_layout_num_params(g_layouts[i]), sizeof(float));
    if (g_params[i] == NULL) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  setup();
  char path[64];
  int fd = fuzz_memfd_path(data, size, path, sizeof path);
  if (fd < 0) return 0;
  for (int i = 0; i < 2; ++i) {
    mp_error err = MP_ERROR_INITIALIZER;
    mp_status status = mp_llmc_load(g_layouts[i], g_params[i], path, &err);
    if (status != MP_OK && err.message[0] == '\0') abort();
  }
  close(fd);
  return 0;
}
