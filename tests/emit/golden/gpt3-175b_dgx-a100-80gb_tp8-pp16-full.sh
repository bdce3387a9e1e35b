#!/usr/bin/env bash
# Megatron-LM training launch for gpt3-175b on dgx-a100-80gb, written by autoshard.
#
#   512 GPUs = 64 nodes x 8 GPUs (A100-SXM4-80GB)
#   TP 8, PP 16, VPP 1, CP 1, DP 4, sequence parallel
#   micro-batch 1, global batch 1536 (384 micro-batches per step), sequence length 2048
#   recompute: full; ZeRO-0 (plain data parallel); bf16
#   layer layout: Megatron default (even split)
#   vocabulary: 50257 tokens, read from $TOKENIZER_MODEL
#
# Run it from a Megatron-LM checkout (or set MEGATRON_LM) on every node:
#   MASTER_ADDR=<node 0> NODE_RANK=<0..63> DATA_PATH=<dataset prefix> TOKENIZER_MODEL=<tokenizer> bash <this script>
# The training hyper-parameters (--train-iters, --lr, ...) are placeholders: edit them.

set -euo pipefail

# Rendezvous (set on every node).
MASTER_ADDR=${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}
NODE_RANK=${NODE_RANK:?set NODE_RANK to the index of this node, 0..63}
MASTER_PORT=${MASTER_PORT:-6000}
NNODES=${NNODES:-64}
GPUS_PER_NODE=8
if (( NNODES * GPUS_PER_NODE != 512 )); then
  echo "this plan needs exactly 512 GPUs (64 x 8); got NNODES=$NNODES" >&2
  exit 1
fi

# Data, tokenizer and checkpoints.
DATA_PATH=${DATA_PATH:?set DATA_PATH to a Megatron-LM indexed dataset prefix (path/to/corpus_text_document)}
TOKENIZER_MODEL=${TOKENIZER_MODEL:?set TOKENIZER_MODEL to a Hugging Face tokenizer name or directory}
CKPT_DIR=${CKPT_DIR:-checkpoints/gpt3-175b}
MEGATRON_LM=${MEGATRON_LM:-$PWD}

# Megatron-LM requires one CUDA hardware queue with TP or CP > 1 on pre-Blackwell GPUs.
export CUDA_DEVICE_MAX_CONNECTIONS=1

torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    "$MEGATRON_LM/pretrain_gpt.py" \
    --num-layers 96 \
    --hidden-size 12288 \
    --ffn-hidden-size 49152 \
    --num-attention-heads 96 \
    --seq-length 2048 \
    --max-position-embeddings 2048 \
    --position-embedding-type learned_absolute \
    --normalization LayerNorm \
    --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$TOKENIZER_MODEL" \
    --tensor-model-parallel-size 8 \
    --pipeline-model-parallel-size 16 \
    --context-parallel-size 1 \
    --sequence-parallel \
    --micro-batch-size 1 \
    --global-batch-size 1536 \
    --recompute-granularity full \
    --recompute-method uniform \
    --recompute-num-layers 1 \
    --overlap-grad-reduce \
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
    --init-method-std 0.0057 \
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
