# The reference host: 8x RTX PRO 6000 Blackwell (SM120, 96 GB, PCIe, no NVLink),
# Kimi K2.6 with TP 8. Defaults are in group_data/all.py; keys are checked by
# tasks/spec/. Export SGLANG_API_KEY on the controller before deploying.
ct200 = [
    (
        "ct200",
        {
            "ssh_hostname": "ct200",
            "ssh_user": "root",
            "model": "kimi-k2.6",
            "gpu_ids": [0, 1, 2, 3, 4, 5, 6, 7],
            "tp_size": 8,
            "attention_backend": "triton",  # fa3 fails on SM120; triton is SGLang's choice for MLA
            "api_key_env": "SGLANG_API_KEY",
            "extra_env": {
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "NCCL_IB_DISABLE": "1",
                "SGLANG_ENABLE_JIT_DEEPGEMM": "0",
                # what operators of 8x RTX PRO 6000 set for Kimi K2.5 with SGLang (local-inference-lab/
                # rtx6kpro inference-engines/sglang.md: "Expandable CUDA memory segments"; it is
                # incompatible with --enable-pcie-oneshot-allreduce, which this profile does not use)
                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                # Where no PCIe switch joins the GPUs (GPUs on two CPU sockets), the same runbook sets
                # NCCL_P2P_LEVEL=4 (= SYS: P2P across the CPU interconnect; optimization/nccl-tuning.md),
                # else NCCL falls back to shared memory (25-44 tok/s instead of 73-90). ASSUMPTION: ct200's
                # topology is not known here; uncomment after `nvidia-smi topo -m` shows SYS between GPUs.
                # "NCCL_P2P_LEVEL": "SYS",
            },
        },
    ),
]
