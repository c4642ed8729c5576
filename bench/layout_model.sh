# layout_model.sh (sourced): the model and batch of bench/layout_bench.sh and bench/plan_bench.sh,
# so that the two measure and plan the same thing: a mixture-of-experts Llama of dim 256, 4 layers
# (the first dense, ffn 688; then 4 experts top-2, expert ffn 344), 8 heads / 2 kv heads, vocab
# 8192 untied, 8 × 256 tokens per step in micro-batches of 2. The caller sets $shard first.
layout_model=(--model.vocab_size=8192 --model.dim=256 --model.n_layers=4 --model.n_heads=8 --model.n_kv_heads=2
     --model.ffn_dim=688 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=344
     --model.moe_first_dense=1 --model.tied_embeddings=false --model.max_seq_len=256
     --training.seq_len=256 --training.global_batch=8 --training.micro_batch=2 --data.train="$shard")
