# GPT-2 ~1.4B (Tables 2 and 3's largest rows) sharded across 8 GPUs with FSDP2 (harness/fsdp.py): each GPU holds 1/8 of the
# fp32 weights, gradients and optimizer moments, so the run fits GPUs that DDP does not (docs/training.md, "Past one
# GPU's memory"). The global batch is the paper's 512 x 256: 32 micro-batches of 16, 4 per GPU.
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2_1.4b_fsdp.py                       # vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2_1.4b_fsdp.py --attn=softmax1 \
#       --optimizer=orthoadam --out_dir=out/gpt2_1.4b_s1oa_fsdp                                          # softmax-1 + OrthoAdam
include('gpt2_1.4b.py')
out_dir = 'out/gpt2_1.4b_fsdp'
fsdp = True
