"""The Megatron backend (megatron-core). Importing it installs ``lazy_fusions``' import finder first, so that
megatron-core, imported later by any module here, does not import TorchDynamo and Inductor at import."""
from primus.backends.megatron.lazy_fusions import install as _install_lazy_fusions

_install_lazy_fusions()
