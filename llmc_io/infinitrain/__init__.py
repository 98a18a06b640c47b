"""InfiniTrain's files, with NumPy: CKPT state dicts (statedict), their names and order (names, layout,
libcxx_order), multi-GPU step directories (ranks, rank_writer, topology), trainer_state.json
(state), lr_scheduler.ckpt (lr_scheduler) and LoRA weights (lora_weights)."""
