# syntax=docker/dockerfile:1
# One image for every Strata process: `strata controller`, `strata compact` (compaction Jobs) and the
# gateway sidecar the operator injects, which runs `strata-gateway`: the gateway alone, with the flags
# of `strata gateway` and less program text resident. Static musl binaries on distroless, running as
# 65532:65532, with nothing to write on the root filesystem (readOnlyRootFilesystem: true works).
#
#   docker build -t ghcr.io/strata-dev/strata:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t ghcr.io/strata-dev/strata:0.1.0 --push .

ARG RUST_VERSION=1.95

# --- build: Alpine's Rust targets musl, so the binary is statically linked --------------------------
FROM rust:${RUST_VERSION}-alpine AS build
RUN apk add --no-cache musl-dev gcc make
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p strata --bin strata --bin strata-gateway \
    && install -D -m 0755 target/release/strata /out/strata \
    && install -D -m 0755 target/release/strata-gateway /out/strata-gateway

# --- runtime: distroless static (CA certificates, /etc/passwd with nonroot, no shell) ---------------
FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="strata" \
      org.opencontainers.image.description="Strata: operator, context gateway and compactor for always-on LLM agents" \
      org.opencontainers.image.source="https://github.com/strata-dev/strata" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/strata /usr/local/bin/strata
COPY --from=build /out/strata-gateway /usr/local/bin/strata-gateway
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/strata"]
CMD ["--help"]
