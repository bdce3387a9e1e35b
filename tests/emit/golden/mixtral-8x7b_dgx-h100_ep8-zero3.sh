#!/usr/bin/env bash
# Megatron-LM training launch for mixtral-8x7b on dgx-h100, written by autoshard.
#
#   16 GPUs = 2 nodes x 8 GPUs (H100-SXM5-80GB)
#   TP 2, PP 1, VPP 1, CP 1, DP 8, EP 8, ETP 1, sequence parallel
#   micro-batch 2, global batch 256 (16 micro-batches per step), sequence length 4096
#   recompute: none; ZeRO-3 (Megatron-FSDP optim_grads_params); bf16
#   layer layout: Megatron default (even split)
#   vocabulary: 32000 tokens, read from $TOKENIZER_MODEL
#
# Run it from a Megatron-LM checkout (or set MEGATRON_LM) on every node:
#   MASTER_ADDR=<node 0> NODE_RANK=<0..1> DATA_PATH=<dataset prefix> TOKENIZER_MODEL=<tokenizer> bash <this script>
# The training hyper-parameters (--train-iters, --lr, ...) are placeholders: edit them.

set -euo pipefail

# Rendezvous (set on every node).
MASTER_ADDR=${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}
NODE_RANK=${NODE_RANK:?set NODE_RANK to the index of this node, 0..1}
MASTER_PORT=${MASTER_PORT:-6000}
NNODES=${NNODES:-2}
GPUS_PER_NODE=8
if (( NNODES * GPUS_PER_NODE != 16 )); then
  echo "this plan needs exactly 16 GPUs (2 x 8); got NNODES=$NNODES" >&2
  exit 1
fi

# Data, tokenizer and checkpoints.
DATA_PATH=${DATA_PATH:?set DATA_PATH to a Megatron-LM indexed dataset prefix (path/to/corpus_text_document)}
TOKENIZER_MODEL=${TOKENIZER_MODEL:?set TOKENIZER_MODEL to a Hugging Face tokenizer name or directory}
CKPT_DIR=${CKPT_DIR:-checkpoints/mixtral-8x7b}
MEGATRON_LM=${MEGATRON_LM:-$PWD}

# Megatron-FSDP requires CUDA_DEVICE_MAX_CONNECTIONS unset or > 1.
unset CUDA_DEVICE_MAX_CONNECTIONS

torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    "$MEGATRON_LM/pretrain_gpt.py" \
    --num-layers 32 \
    --hidden-size 4096 \
    --ffn-hidden-size 14336 \
    --num-attention-heads 32 \
    --group-query-attention \
    --num-query-groups 8 \
    --seq-length 4096 \
    --max-position-embeddings 32768 \
    --position-embedding-type rope \
    --rotary-base 1000000 \
    --normalization RMSNorm \
    --swiglu \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --num-experts 8 \
    --moe-router-topk 2 \
    --moe-ffn-hidden-size 14336 \
    --moe-grouped-gemm \
    --moe-token-dispatcher-type alltoall \
    --moe-router-load-balancing-type aux_loss \
    --moe-aux-loss-coeff 1e-2 \
    --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$TOKENIZER_MODEL" \
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 1 \
    --context-parallel-size 1 \
    --expert-model-parallel-size 8 \
    --expert-tensor-parallel-size 1 \
    --sequence-parallel \
    --micro-batch-size 2 \
    --global-batch-size 256 \
    --use-distributed-optimizer \
    --use-megatron-fsdp \
    --data-parallel-sharding-strategy optim_grads_params \
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
