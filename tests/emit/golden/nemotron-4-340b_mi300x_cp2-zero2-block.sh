#!/usr/bin/env bash
# Megatron-LM training launch for nemotron-4-340b on mi300x, written by autoshard.
#
#   256 GPUs = 32 nodes x 8 GPUs (MI300X-192GB)
#   TP 8, PP 4, VPP 1, CP 2, DP 4, sequence parallel
#   micro-batch 1, global batch 2304 (576 micro-batches per step), sequence length 4096
#   recompute: full recompute of the first 2 decoder layers of each stage; ZeRO-2 (Megatron-FSDP optim_grads); bf16
#   layer layout: Megatron default (even split)
#   vocabulary: 256000 tokens, read from $TOKENIZER_MODEL
#
# Run it from a Megatron-LM checkout (or set MEGATRON_LM) on every node:
#   MASTER_ADDR=<node 0> NODE_RANK=<0..31> DATA_PATH=<dataset prefix> TOKENIZER_MODEL=<tokenizer> bash <this script>
# The training hyper-parameters (--train-iters, --lr, ...) are placeholders: edit them.

set -euo pipefail

# Rendezvous (set on every node).
MASTER_ADDR=${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}
NODE_RANK=${NODE_RANK:?set NODE_RANK to the index of this node, 0..31}
MASTER_PORT=${MASTER_PORT:-6000}
NNODES=${NNODES:-32}
GPUS_PER_NODE=8
if (( NNODES * GPUS_PER_NODE != 256 )); then
  echo "this plan needs exactly 256 GPUs (32 x 8); got NNODES=$NNODES" >&2
  exit 1
fi

# Data, tokenizer and checkpoints.
DATA_PATH=${DATA_PATH:?set DATA_PATH to a Megatron-LM indexed dataset prefix (path/to/corpus_text_document)}
TOKENIZER_MODEL=${TOKENIZER_MODEL:?set TOKENIZER_MODEL to a Hugging Face tokenizer name or directory}
CKPT_DIR=${CKPT_DIR:-checkpoints/nemotron-4-340b}
MEGATRON_LM=${MEGATRON_LM:-$PWD}

# Megatron-FSDP requires CUDA_DEVICE_MAX_CONNECTIONS unset or > 1.
unset CUDA_DEVICE_MAX_CONNECTIONS

torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    "$MEGATRON_LM/pretrain_gpt.py" \
    --num-layers 96 \
    --hidden-size 18432 \
    --ffn-hidden-size 73728 \
    --num-attention-heads 96 \
    --group-query-attention \
    --num-query-groups 8 \
    --seq-length 4096 \
    --max-position-embeddings 4096 \
    --position-embedding-type rope \
    --rotary-base 10000 \
    --rotary-percent 0.5 \
    --normalization LayerNorm \
    --squared-relu \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$TOKENIZER_MODEL" \
    --tensor-model-parallel-size 8 \
    --pipeline-model-parallel-size 4 \
    --context-parallel-size 2 \
    --sequence-parallel \
    --micro-batch-size 1 \
    --global-batch-size 2304 \
    --recompute-granularity full \
    --recompute-method block \
    --recompute-num-layers 2 \
    --use-distributed-optimizer \
    --use-megatron-fsdp \
    --data-parallel-sharding-strategy optim_grads \
    --ckpt-format fsdp_dtensor \
    --overlap-grad-reduce \
    --overlap-param-gather \
    --bf16 \
    --cross-entropy-loss-fusion \
    --optimizer adam \
    --adam-beta1 0.9 \
    --adam-beta2 0.95 \
    --train-iters 100000 \
    --lr 3.0e-4 \
    --min-lr 3.0e-5 \
    --lr-decay-style cosine \
    --lr-warmup-fraction 0.01 \
    --weight-decay 0.1 \
    --clip-grad 1.0 \
    --attention-dropout 0.0 \
    --hidden-dropout 0.0 \
    --init-method-std 0.0047 \
    --data-path "$DATA_PATH" \
    --split 99,1,0 \
    --save "$CKPT_DIR" \
    --load "$CKPT_DIR" \
    --save-interval 1000 \
    --log-interval 10 \
    --log-throughput \
    --eval-interval 1000 \
    --eval-iters 10 \
    --transformer-impl transformer_engine \
    --attention-backend auto
