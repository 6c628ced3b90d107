# syntax=docker/dockerfile:1
# Multi-stage build: static binaries on a distroless base.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ENV CGO_ENABLED=0
# The build context has no .git, so `--version` would say (devel): the
# version and commit come in as build arguments (docker-compose passes them
# from .env: LLMQ_VERSION, LLMQ_COMMIT=$(git rev-parse HEAD)).
ARG LLMQ_VERSION=
ARG LLMQ_COMMIT=
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -buildvcs=false \
      -ldflags="-s -w -X github.com/llmq/llmq/internal/buildinfo.Version=${LLMQ_VERSION} -X github.com/llmq/llmq/internal/buildinfo.Commit=${LLMQ_COMMIT}" \
      -o /out/ ./cmd/dispatcher ./cmd/worker ./cmd/llmq ./cmd/llmq-sim

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
COPY llmq.example.yaml /etc/llmq/llmq.yaml
ENV LLMQ_POLICY=/etc/llmq/llmq.yaml
USER nonroot:nonroot
EXPOSE 8080 9464
ENTRYPOINT ["/usr/local/bin/dispatcher"]
