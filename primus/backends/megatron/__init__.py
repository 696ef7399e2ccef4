"""The Megatron backend (megatron-core). Importing it puts ``lazy_fusions``' import finder in place first, so that
megatron-core, imported later by any module here, does not import TorchDynamo and Inductor at import."""
from primus.backends.megatron.patches import patch_lazy_fusion_compile

patch_lazy_fusion_compile()
