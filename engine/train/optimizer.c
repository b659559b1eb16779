/* engine/train/optimizer.c — the optimizer step after the gradients are final: AdamW with the
 * gradients clipped to the global norm on each chunk's part, through the stage's table (on the
 * CPU the clip factor inside the update, on the GPU a scaling pass first), then ZeRO's parameter
 * gather. */
#include "engine/train/trainer_internal.h"

#include "layers/adamw.h"

mp_stage_adamw mp_trainer_adamw_settings(const mp_training_config *t, int64_t step,
                                         double grad_norm) {
  const mp_stage_adamw adamw = {.learning_rate = (float)mp_training_learning_rate(t, step),
                                .beta1 = (float)t->beta1,
                                .beta2 = (float)t->beta2,
                                .eps = (float)t->eps,
                                .weight_decay = (float)t->weight_decay,
                                .step = (int)(step + 1),
                                .grad_scale = mp_clip_scale(grad_norm, t->grad_clip)};
  return adamw;
}

mp_status mp_train_optimizer_step(mp_trainer *trainer, double grad_norm, mp_error *err) {
  const mp_stage_adamw adamw =
      mp_trainer_adamw_settings(&trainer->plan->training, trainer->step, grad_norm);
  for (int c = 0; c < trainer->num_chunks; ++c) {
    const mp_stage_state *chunk = &trainer->stages[c];
    MP_TRY(chunk->ops->adamw(chunk->stage, &adamw, err));
    MP_TRY(mp_train_zero_gather_updated(trainer, c, err));
  }
  return MP_OK;
}
