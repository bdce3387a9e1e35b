#!/usr/bin/env bash
# Megatron-LM training launch for llama-3.1-8b on dgx-h100, written by autoshard.
#
#   8 GPUs = 1 node x 8 GPUs (H100-SXM5-80GB)
#   TP 2, PP 1, VPP 1, CP 1, DP 4, sequence parallel
#   micro-batch 1, global batch 512 (128 micro-batches per step), sequence length 8192
#   recompute: selective; ZeRO-1 (distributed optimizer); bf16
#   layer layout: Megatron default (even split)
#   vocabulary: 128256 tokens, read from $TOKENIZER_MODEL
#
# Run it from a Megatron-LM checkout (or set MEGATRON_LM):
#   DATA_PATH=<dataset prefix> TOKENIZER_MODEL=<tokenizer> bash <this script>
# The training hyper-parameters (--train-iters, --lr, ...) are placeholders: edit them.

set -euo pipefail

# Rendezvous (set on every node).
MASTER_ADDR=${MASTER_ADDR:-localhost}
NODE_RANK=${NODE_RANK:-0}
MASTER_PORT=${MASTER_PORT:-6000}
NNODES=${NNODES:-1}
GPUS_PER_NODE=8
if (( NNODES * GPUS_PER_NODE != 8 )); then
  echo "this plan needs exactly 8 GPUs (1 x 8); got NNODES=$NNODES" >&2
  exit 1
fi

# Data, tokenizer and checkpoints.
DATA_PATH=${DATA_PATH:?set DATA_PATH to a Megatron-LM indexed dataset prefix (path/to/corpus_text_document)}
TOKENIZER_MODEL=${TOKENIZER_MODEL:?set TOKENIZER_MODEL to a Hugging Face tokenizer name or directory}
CKPT_DIR=${CKPT_DIR:-checkpoints/llama-3.1-8b}
MEGATRON_LM=${MEGATRON_LM:-$PWD}

# Megatron-LM requires one CUDA hardware queue with TP or CP > 1 on pre-Blackwell GPUs.
export CUDA_DEVICE_MAX_CONNECTIONS=1

torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    "$MEGATRON_LM/pretrain_gpt.py" \
    --num-layers 32 \
    --hidden-size 4096 \
    --ffn-hidden-size 14336 \
    --num-attention-heads 32 \
    --group-query-attention \
    --num-query-groups 8 \
    --seq-length 8192 \
    --max-position-embeddings 131072 \
    --position-embedding-type rope \
    --rotary-base 500000 \
    --use-rope-scaling \
    --normalization RMSNorm \
    --swiglu \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$TOKENIZER_MODEL" \
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 1 \
    --context-parallel-size 1 \
    --sequence-parallel \
    --micro-batch-size 1 \
    --global-batch-size 512 \
    --recompute-granularity selective \
    --use-distributed-optimizer \
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
    --init-method-std 0.0099 \
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
