"""vLLM 0.33.0's `vllm serve` flag vocabulary, as its parser declares it (`EngineArgs.add_cli_args` and
the OpenAI frontend arguments): switches, flags with one or several values, short aliases, and the flags
removed since (with what replaced them). Data only; `autoshard.emit.vllm.parse` reads commands with it.
"""

from __future__ import annotations

__all__ = ["VLLM_VERSION", "NO_VALUE", "ONE_VALUE", "MULTI_VALUE", "STORE_TRUE", "ALIASES", "REMOVED",
           "REMOVED_SWITCHES", "KNOWN"]

VLLM_VERSION = "0.33.0"

# Switches (take no value).
NO_VALUE: frozenset[str] = frozenset(
    """
    --aggregate-engine-logging --allow-credentials --allow-deprecated-quantization
    --async-scheduling --cohere-is-reasoning-model --cudagraph-metrics --data-parallel-external-lb
    --data-parallel-hybrid-lb --data-parallel-multi-port-external-lb --dcp-q-replicate
    --disable-cascade-attn --disable-chunked-mm-input --disable-custom-all-reduce
    --disable-fastapi-docs --disable-hybrid-kv-cache-manager --disable-log-stats
    --disable-nccl-for-dp-synchronization --disable-sliding-window --disable-uvicorn-access-log
    --enable-auto-tool-choice --enable-batch-sharded-sampling --enable-chunked-prefill
    --enable-cumem-allocator --enable-dbo --enable-elastic-ep --enable-ep-weight-filter
    --enable-eplb --enable-expert-parallel --enable-fault-tolerance --enable-flash-late-interaction
    --enable-flashinfer-autotune --enable-force-include-usage --enable-hc-sp
    --enable-layerwise-nvtx-tracing --enable-log-deltas --enable-log-outputs --enable-log-requests
    --enable-logging-iteration-details --enable-lora --enable-mamba-cache-stochastic-rounding
    --enable-mamba-shared-prefix-checkpoint --enable-mfu-metrics --enable-mixed-moe-lora-format
    --enable-mm-embeds --enable-moe-shared-loras --enable-nccl-comm-suspend --enable-offline-docs
    --enable-per-request-metrics --enable-prefix-caching --enable-prompt-embeds
    --enable-prompt-tokens-details --enable-request-id-headers --enable-return-routed-experts
    --enable-scale-out --enable-server-load-tracking --enable-shm-tensor-arena --enable-sleep-mode
    --enable-ssl-refresh --enable-tokenizer-info-endpoint --enable-tower-connector-lora
    --enable-trace-replay --enforce-eager --exclude-tools-when-tool-choice-none
    --fail-on-environ-validation --fully-sharded-loras --grpc --headless --interleave-mm-strings
    --jit-monitor-verbose --kv-cache-metrics --kv-sharing-fast-prefill --language-model-only
    --log-error-stack --long-prefill-token-threshold-adaptive --mm-device-do-normalize
    --mm-encoder-only --monokernel --numa-bind --ray-workers-use-nsight --return-sampling-mask
    --return-tokens-as-token-ids --scheduler-reserve-full-isl --skip-mm-profiling
    --skip-tokenizer-init --sleep-mode-offload-cudagraph --specialize-active-lora
    --swa-bounded-replay --tokens-only --trust-remote-code --trust-request-chat-template
    --trust-request-mm-kwargs --use-fp64-gumbel --use-replayssm --use-tqdm-on-load
""".split()
)

# Flags that take a value.
ONE_VALUE: frozenset[str] = frozenset(
    """
    --additional-config --all2all-backend --allowed-headers --allowed-local-media-path
    --allowed-media-domains --allowed-methods --allowed-origins --anthropic-disabled-thinking-effort
    --api-key --api-server-count --attention-backend --attention-config --aux-output-config
    --block-size --chat-template --chat-template-content-format --code-revision --cohere-format
    --collect-detailed-traces --compilation-config --config --config-format --convert
    --cp-kv-cache-interleave-size --cpu-distributed-timeout-seconds --cpu-offload-gb
    --cpu-offload-params --cudagraph-capture-sizes --custom-histogram-buckets
    --data-parallel-address --data-parallel-backend --data-parallel-rank --data-parallel-rpc-port
    --data-parallel-size --data-parallel-size-local --data-parallel-start-rank
    --data-parallel-supervisor-port --dbo-decode-token-threshold --dbo-prefill-token-threshold
    --dcp-comm-backend --dcp-kv-cache-interleave-size --decode-context-parallel-size
    --default-chat-template-kwargs --default-mm-loras --device-ids --diffusion-config
    --disable-access-log-for-endpoints --distributed-executor-backend --distributed-timeout-seconds
    --download-dir --dp-supervisor-probe-failure-threshold --dp-supervisor-probe-interval-s
    --dp-supervisor-probe-timeout-s --dp-sync-interval --dtype --ec-manager-config
    --ec-transfer-config --elastic-ep-max-dp-size --engram-config --eplb-config
    --expert-placement-strategy --fault-tolerance-config --fingerprint-mode --fingerprint-value
    --gdn-prefill-backend --generation-config --gpu-memory-utilization --grpc-port
    --h11-max-header-count --h11-max-incomplete-event-size --hf-config-path --hf-overrides
    --hf-token --host --ignore-patterns --io-processor-plugin --ir-op-priority --jit-monitor-mode
    --kda-decode-backend --kda-prefill-backend --kernel-config --kv-cache-dtype
    --kv-cache-dtype-skip-layers --kv-cache-memory-bytes --kv-cache-metrics-sample
    --kv-events-config --kv-offloading-backend --kv-offloading-size --kv-transfer-config
    --limit-mm-per-prompt --linear-backend --load-format --log-config-file --log-level
    --logging-config --logits-processors --logprobs-mode --long-prefill-token-threshold --lora-dtype
    --lora-modules --lora-target-modules --mamba-backend --mamba-block-size --mamba-cache-dtype
    --mamba-cache-mode --mamba-cache-philox-rounds --mamba-ssm-cache-dtype --mamba-ssu-algorithm
    --master-addr --master-port --max-cpu-loras --max-cudagraph-capture-size --max-log-len
    --max-logprobs --max-lora-cls-labels --max-lora-rank --max-loras --max-model-len
    --max-num-active-seqs --max-num-batched-tokens --max-num-queued-reqs --max-num-queued-tokens
    --max-num-scheduled-tokens --max-num-seqs --max-parallel-loading-workers --media-io-kwargs
    --middleware --mm-encoder-attn-backend --mm-encoder-attn-dtype --mm-encoder-fp8-scale-path
    --mm-encoder-fp8-scale-save-margin --mm-encoder-fp8-scale-save-path --mm-encoder-tp-mode
    --mm-hasher-algorithm --mm-ipc-gpu-memory-gb --mm-processor-cache-gb --mm-processor-cache-type
    --mm-processor-device --mm-processor-kwargs --mm-shm-cache-max-object-size-mb --mm-tensor-ipc
    --model --model-class-overrides --model-impl --model-loader-extra-config --moe-backend --nnodes
    --node-rank --num-gpu-blocks-override --numa-bind-cpus --numa-bind-nodes --offload-backend
    --offload-group-size --offload-num-in-group --offload-params --offload-prefetch-step
    --optimization-level --otlp-traces-endpoint --override-generation-config
    --per-request-spec-decode-metrics --performance-mode --pipeline-parallel-size --pooler-config
    --port --prefill-context-parallel-size --prefill-schedule-interval
    --prefix-cache-retention-interval --prefix-caching-hash-algo --prefix-match-unit
    --profiler-config --pt-load-map-location --quantization --quantization-config --reasoning-config
    --reasoning-effort-map --reasoning-parser --reasoning-parser-plugin --renderer-num-workers
    --replayssm-buffer-len --response-role --revision --root-path --runner
    --safetensors-load-strategy --safetensors-prefetch-block-size --safetensors-prefetch-num-threads
    --scheduler-cls --scheduling-policy --seed --served-model-name --show-hidden-metrics-for-version
    --shutdown-timeout --sleep-mode-backend --sleep-preserve-parameter-names
    --sparse-indexer-topk-backend --spec-method --spec-model --spec-tokens --speculative-config
    --sse-keep-alive-interval --ssl-ca-certs --ssl-cert-reqs --ssl-certfile --ssl-ciphers
    --ssl-keyfile --stream-interval --structured-outputs-config --tensor-parallel-size --tokenizer
    --tokenizer-mode --tokenizer-revision --tool-call-parser --tool-parser-plugin --tool-server
    --tool-strict-level --ubatch-size --uds --uvicorn-log-level --video-pruning-method
    --video-pruning-rate --watchdog-config --watermark --watermark-config --weight-transfer-config
    --worker-cls --worker-extension-cls model_tag
""".split()
)

MULTI_VALUE: frozenset[str] = frozenset(
    """
    --allowed-headers --allowed-media-domains --allowed-methods --allowed-origins --api-key
    --collect-detailed-traces --cpu-offload-params --cudagraph-capture-sizes --ignore-patterns
    --kv-cache-dtype-skip-layers --logits-processors --lora-modules --lora-target-modules --middleware
    --numa-bind-cpus --numa-bind-nodes --offload-params --served-model-name --sleep-preserve-parameter-names
""".split()
)

# Switches without a --no-X form (plain store_true).
STORE_TRUE = frozenset(
    "--aggregate-engine-logging --data-parallel-multi-port-external-lb --disable-log-stats "
    "--grpc --headless".split()
)

ALIASES: dict[str, str] = {
    "-q": "--quantization",
    "-pp": "--pipeline-parallel-size",
    "-n": "--nnodes",
    "-r": "--node-rank",
    "-tp": "--tensor-parallel-size",
    "-dcp": "--decode-context-parallel-size",
    "-pcp": "--prefill-context-parallel-size",
    "-dp": "--data-parallel-size",
    "-dpn": "--data-parallel-rank",
    "-dpr": "--data-parallel-start-rank",
    "-dpl": "--data-parallel-size-local",
    "-dpa": "--data-parallel-address",
    "-dpp": "--data-parallel-rpc-port",
    "-dpb": "--data-parallel-backend",
    "-dph": "--data-parallel-hybrid-lb",
    "-dpe": "--data-parallel-external-lb",
    "-dpm": "--data-parallel-multi-port-external-lb",
    "-ep": "--enable-expert-parallel",
    "-sc": "--speculative-config",
    "-dc": "--diffusion-config",
    "-cc": "--compilation-config",
    "-ac": "--attention-config",
    "-asc": "--api-server-count",
    "--device-memory-utilization": "--gpu-memory-utilization",
}

REMOVED: dict[str, str] = {
    "--swap-space": "removed after v0.11; vLLM V1 does not swap the KV cache to CPU",
    "--task": "removed; use --runner {auto,generate,pooling,draft} and --convert {auto,none,embed,classify}",
    "--use-v2-block-manager": "removed (the V0 engine is gone)",
    "--num-scheduler-steps": "removed (multi-step scheduling is gone)",
    "--speculative-model": "removed; use --speculative-config JSON",
    "--num-speculative-tokens": 'removed; use --speculative-config {"num_speculative_tokens": N}',
    "--max-seq-len-to-capture": "removed; use --max-cudagraph-capture-size / --cudagraph-capture-sizes",
    "--guided-decoding-backend": "removed; use --structured-outputs-config",
    "--tokenizer-pool-size": "removed",
    "--preemption-mode": "removed",
    "--num-redundant-experts": 'removed; use --eplb-config {"num_redundant_experts": N}',
    "--eplb-window-size": "removed; use --eplb-config",
    "--eplb-step-interval": "removed; use --eplb-config",
    "--eplb-log-balancedness": "removed; use --eplb-config",
    "--cuda-graph-sizes": "removed; use --cudagraph-capture-sizes",
    "--enable-multimodal-encoder-data-parallel": "removed; use --mm-encoder-tp-mode data",
    "--disable-mm-preprocessor-cache": "removed; use --mm-processor-cache-gb 0",
    "--override-pooler-config": "removed; use --pooler-config",
    "--rope-scaling": "removed; use --hf-overrides",
    "--rope-theta": "removed; use --hf-overrides",
    "--worker-use-ray": "removed; use --distributed-executor-backend ray",
    "--engine-use-ray": "removed",
    "--disable-frontend-multiprocessing": "removed",
}
REMOVED_SWITCHES = frozenset(
    "--use-v2-block-manager --eplb-log-balancedness --enable-multimodal-encoder-data-parallel "
    "--disable-mm-preprocessor-cache --worker-use-ray --engine-use-ray "
    "--disable-frontend-multiprocessing".split()
)

KNOWN: frozenset[str] = NO_VALUE | ONE_VALUE | MULTI_VALUE
