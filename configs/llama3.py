"""LLaMA-3 as InfiniTrain defines it.

  python -m jaxtrain.main --config=configs/llama3.py
trains the random-init `tiny` LLaMA-3 (2 layers, 64 channels, the real 128256-id vocabulary:
16.5M parameters) offline on the built-in corpus: the Python standard library's source as
byte-level ids in LLaMA-3 token shards (magic 20240801, uint32), built once into the cache
directory. At tiny's learning rate 1e-2 the loss falls from ln(128256) ≈ 11.8 to about 5 in
the 10 default steps (about 20 s on 2 CPU cores), and the run ends by printing a sample,
decoded by the built-in byte-level tokenizer. Your own data: --input_bin 'llama3_train_*.bin'
(llm.c's dev/data scripts, or `python -m llmc_io shard FILES --family llama3 --output PREFIX`).

Variants: configs/llama3.py:tiny|small|llama3.2-1b|llama3-8b|llama3 (tiny is the default;
llama3.2-1b has 1.5B parameters with its untied head; llama3 is InfiniTrain's 1B shape);
every variant but tiny trains at InfiniTrain's 1e-5. `infinitrain`: every default of
InfiniTrain's llama3 example (Adam, β2 0.999, constant 1e-5, one device, keep 3 checkpoints;
docs/infinitrain.md's "InfiniTrain's command line" lists the differences). With --llmc_filepath the
file's header sets the shape (pass --learning_rate, or use :infinitrain, when fine-tuning a
real model: 1e-2 is tiny's).
"""

from jaxtrain.config.keys import base_config


def get_config(variant: str = ''):
    config = base_config('llama3')
    config.model = variant or 'tiny'  # LLaMA-3 variant; an --llmc_filepath header overrides it
    # tiny from random init learns visibly in 10 steps only at a high rate; the others take
    # InfiniTrain's LLaMA-3 example's 1e-5.
    config.learning_rate = 1e-2 if config.model == 'tiny' else 1e-5
    config.beta2 = 0.999  # InfiniTrain's LLaMA-3 Adam
    if variant == 'infinitrain':
        # example/llama3/main.cc at InfiniTensor/InfiniTrain b24d92f: its defaults, key by key.
        config.model = 'llama3'  # --model llama3; --llmc_filepath overrides it
        config.optimizer = 'adam'  # optimizers::Adam: β1 0.9, β2 0.999, eps 1e-8, no weight decay
        config.lr_schedule = 'constant'  # a fixed --learning_rate
        config.num_devices = 1  # --nthread_per_process 1
        config.max_checkpoint_keep = 3  # --max_checkpoint_keep 3
    return config
