#!/usr/bin/env bash
# Megatron-LM training launch for qwen3-30b-a3b on dgx-b200, written by autoshard.
#
#   32 GPUs = 4 nodes x 8 GPUs (B200-SXM-180GB)
#   TP 2, PP 2, VPP 2, CP 1, DP 8, EP 8, ETP 2, sequence parallel
#   micro-batch 1, global batch 1024 (128 micro-batches per step), sequence length 4096
#   recompute: selective; ZeRO-1 (distributed optimizer); bf16
#   layer layout: Megatron default (even split)
#   vocabulary: 151936 tokens, read from $TOKENIZER_MODEL
#
# Run it from a Megatron-LM checkout (or set MEGATRON_LM) on every node:
#   MASTER_ADDR=<node 0> NODE_RANK=<0..3> DATA_PATH=<dataset prefix> TOKENIZER_MODEL=<tokenizer> bash <this script>
# The training hyper-parameters (--train-iters, --lr, ...) are placeholders: edit them.

set -euo pipefail

# Rendezvous (set on every node).
MASTER_ADDR=${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}
NODE_RANK=${NODE_RANK:?set NODE_RANK to the index of this node, 0..3}
MASTER_PORT=${MASTER_PORT:-6000}
NNODES=${NNODES:-4}
GPUS_PER_NODE=8
if (( NNODES * GPUS_PER_NODE != 32 )); then
  echo "this plan needs exactly 32 GPUs (4 x 8); got NNODES=$NNODES" >&2
  exit 1
fi

# Data, tokenizer and checkpoints.
DATA_PATH=${DATA_PATH:?set DATA_PATH to a Megatron-LM indexed dataset prefix (path/to/corpus_text_document)}
TOKENIZER_MODEL=${TOKENIZER_MODEL:?set TOKENIZER_MODEL to a Hugging Face tokenizer name or directory}
CKPT_DIR=${CKPT_DIR:-checkpoints/qwen3-30b-a3b}
MEGATRON_LM=${MEGATRON_LM:-$PWD}

torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    "$MEGATRON_LM/pretrain_gpt.py" \
    --num-layers 48 \
    --hidden-size 2048 \
    --ffn-hidden-size 6144 \
    --num-attention-heads 32 \
    --group-query-attention \
    --num-query-groups 4 \
    --kv-channels 128 \
    --seq-length 4096 \
    --max-position-embeddings 40960 \
    --position-embedding-type rope \
    --rotary-base 1000000 \
    --normalization RMSNorm \
    --swiglu \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --qk-layernorm \
    --num-experts 128 \
    --moe-router-topk 8 \
    --moe-ffn-hidden-size 768 \
    --moe-grouped-gemm \
    --moe-token-dispatcher-type alltoall \
    --moe-router-load-balancing-type aux_loss \
    --moe-aux-loss-coeff 1e-2 \
    --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$TOKENIZER_MODEL" \
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 2 \
    --context-parallel-size 1 \
    --expert-model-parallel-size 8 \
    --expert-tensor-parallel-size 2 \
    --sequence-parallel \
    --num-virtual-stages-per-pipeline-rank 2 \
    --micro-batch-size 1 \
    --global-batch-size 1024 \
    --recompute-granularity selective \
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --overlap-param-gather \
    --tp-comm-overlap \
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
    --init-method-std 0.0140 \
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
