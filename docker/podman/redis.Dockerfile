# Stands in for the official Redis image that docker/compose.yaml names, where no registry can be
# reached: Debian bookworm's redis-server (7.0) on the Debian base that docker/podman/setup.sh
# makes. Built by `docker/podman/setup.sh redis`.
FROM docker.io/library/python:3.11-slim

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* \
    && install -d -o redis -g redis /data
COPY redis-entrypoint.sh /usr/local/bin/redis-entrypoint

WORKDIR /data
EXPOSE 6379
ENTRYPOINT ["redis-entrypoint"]
CMD ["redis-server"]
