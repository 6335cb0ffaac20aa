"""Builds kiln._kiln with kiln's own CMake (see pyproject.toml).

CMake configures the whole repository (the directory above this one) with
only kiln::core and the Python module enabled, and builds the one target
kiln_python_ext; its output is copied where setuptools expects the
extension. KILN_CMAKE_ARGS (space-separated) adds options to the configure.
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        if not os.path.exists(os.path.join(ROOT, "src", "python", "kiln_module.cc")):
            sys.exit("kiln: %s is not kiln's source tree; run pip install ./python from a "
                     "clone of the repository" % ROOT)
        build_dir = os.path.abspath(os.path.join(self.build_temp, "kiln-cmake"))
        configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                     "-DKILN_WITH_IMAGE=OFF", "-DKILN_WITH_TORCH=OFF", "-DKILN_BUILD_TESTS=OFF",
                     "-DKILN_WITH_PYTHON=ON", "-DPython3_EXECUTABLE=" + sys.executable]
        configure += os.environ.get("KILN_CMAKE_ARGS", "").split()
        subprocess.check_call(configure)
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            if "KILN_PYTHON_BUILT:INTERNAL=ON" not in f.read():
                sys.exit("kiln: CMake did not find Python's headers or pybind11 (see its "
                         "message above); install python3-dev and pybind11-dev")
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "kiln_python_ext",
                               "-j", jobs])
        built = glob.glob(os.path.join(build_dir, "python", "kiln", "_kiln*.so"))
        if len(built) != 1:
            sys.exit("kiln: expected one _kiln*.so in %s, found %r" % (build_dir, built))
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built[0], dest)


setup(packages=["kiln"], ext_modules=[CMakeExtension("kiln._kiln")],
      cmdclass={"build_ext": CMakeBuild})
