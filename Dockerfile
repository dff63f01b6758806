# Dataflow custom-container worker image for img2tfrecord.
# The Beam SDK boot binary comes from the Beam SDK image of exactly the pinned Beam version.
FROM apache/beam_python3.11_sdk:2.77.0 AS beam

FROM python:3.11-slim
COPY --from=beam /opt/apache/beam /opt/apache/beam
WORKDIR /opt/img2tfrecord
COPY setup.py README.md ./
COPY beam_pipeline ./beam_pipeline
COPY transforms ./transforms
RUN pip install --no-cache-dir . && pip check
ENTRYPOINT ["/opt/apache/beam/boot"]
