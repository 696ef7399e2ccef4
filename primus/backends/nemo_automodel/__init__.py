"""NeMo AutoModel backend (Wan 2.2 text-to-video diffusion). Engine imports stay inside methods. Importing it
puts the import finder of ``patches.compile_on_first_call`` in place first, so that AutoModel, imported later by any
module here, does not import Inductor at import."""
from primus.backends.nemo_automodel.patches import compile_on_first_call

compile_on_first_call()
