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
            },
        },
    ),
]
