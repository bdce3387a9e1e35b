#!/usr/bin/env bash
# Megatron-LM training launch for deepseek-v3 on gb200-nvl72, written by autoshard.
#
#   576 GPUs = 144 nodes x 4 GPUs (GB200-186GB)
#   TP 2, PP 8, VPP 2, CP 1, DP 36, EP 8, ETP 1, sequence parallel
#   micro-batch 1, global batch 2304 (64 micro-batches per step), sequence length 4096
#   recompute: selective + full recompute of the first 1 decoder layer of each stage; ZeRO-1 (distributed optimizer); fp8
#   layer layout: Et*3|(t*4|)*14,t*2mL
#   vocabulary: 129280 tokens, read from $TOKENIZER_MODEL
#
# Run it from a Megatron-LM checkout (or set MEGATRON_LM) on every node:
#   MASTER_ADDR=<node 0> NODE_RANK=<0..143> DATA_PATH=<dataset prefix> TOKENIZER_MODEL=<tokenizer> bash <this script>
# The training hyper-parameters (--train-iters, --lr, ...) are placeholders: edit them.
# NOTE: the plan combines selective recompute with full recompute of the first 1 decoder layer(s) of
#       each stage; Megatron-LM takes one --recompute-granularity, so the launch uses block full
#       recompute only (the other layers keep all activations: a little more memory than planned)

set -euo pipefail

# Rendezvous (set on every node).
MASTER_ADDR=${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}
NODE_RANK=${NODE_RANK:?set NODE_RANK to the index of this node, 0..143}
MASTER_PORT=${MASTER_PORT:-6000}
NNODES=${NNODES:-144}
GPUS_PER_NODE=4
if (( NNODES * GPUS_PER_NODE != 576 )); then
  echo "this plan needs exactly 576 GPUs (144 x 4); got NNODES=$NNODES" >&2
  exit 1
fi

# Data, tokenizer and checkpoints.
DATA_PATH=${DATA_PATH:?set DATA_PATH to a Megatron-LM indexed dataset prefix (path/to/corpus_text_document)}
TOKENIZER_MODEL=${TOKENIZER_MODEL:?set TOKENIZER_MODEL to a Hugging Face tokenizer name or directory}
CKPT_DIR=${CKPT_DIR:-checkpoints/deepseek-v3}
MEGATRON_LM=${MEGATRON_LM:-$PWD}

torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    "$MEGATRON_LM/pretrain_gpt.py" \
    --num-layers 61 \
    --hidden-size 7168 \
    --ffn-hidden-size 18432 \
    --num-attention-heads 128 \
    --multi-latent-attention \
    --q-lora-rank 1536 \
    --kv-lora-rank 512 \
    --qk-head-dim 128 \
    --qk-pos-emb-head-dim 64 \
    --v-head-dim 128 \
    --seq-length 4096 \
    --max-position-embeddings 163840 \
    --position-embedding-type rope \
    --rotary-base 10000 \
    --rotary-scaling-factor 40 \
    --mscale 1 \
    --mscale-all-dim 1 \
    --normalization RMSNorm \
    --swiglu \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --num-experts 256 \
    --moe-router-topk 8 \
    --moe-ffn-hidden-size 2048 \
    --moe-shared-expert-intermediate-size 2048 \
    --moe-layer-freq '([0]*3+[1]*58)' \
    --moe-router-score-function sigmoid \
    --moe-router-dtype fp32 \
    --moe-router-num-groups 8 \
    --moe-router-group-topk 4 \
    --moe-router-topk-scaling-factor 2.5 \
    --moe-grouped-gemm \
    --moe-token-dispatcher-type alltoall \
    --moe-router-enable-expert-bias \
    --moe-router-bias-update-rate 1e-3 \
    --moe-router-load-balancing-type seq_aux_loss \
    --moe-aux-loss-coeff 1e-4 \
    --mtp-num-layers 1 \
    --mtp-loss-scaling-factor 0.1 \
    --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$TOKENIZER_MODEL" \
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 8 \
    --context-parallel-size 1 \
    --expert-model-parallel-size 8 \
    --expert-tensor-parallel-size 1 \
    --sequence-parallel \
    --pipeline-model-parallel-layout 'Et*3|(t*4|)*14,t*2mL' \
    --micro-batch-size 1 \
    --global-batch-size 2304 \
    --recompute-granularity full \
    --recompute-method block \
    --recompute-num-layers 1 \
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --overlap-param-gather \
    --bf16 \
    --fp8-format hybrid \
    --fp8-recipe mxfp8 \
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
    --init-method-std 0.0075 \
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
