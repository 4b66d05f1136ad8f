# One image, two binaries: the operator (/manager) and the protocol sidecar
# (/hcp-sidecar). Static, distroless, non-root; nothing needs a shell at run time.
# The build flags below are the ones `make build` uses (GO_BUILD_FLAGS);
# hack/check-dockerfile.sh keeps the two in step.
FROM golang:1.26 AS builder
ARG TARGETOS=linux
ARG TARGETARCH=amd64
WORKDIR /workspace
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/
COPY pkg/ pkg/
ENV CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH}
RUN go build -trimpath -ldflags="-s -w" -o /out/manager ./cmd/manager
RUN go build -trimpath -ldflags="-s -w" -o /out/hcp-sidecar ./cmd/hcp-sidecar

FROM gcr.io/distroless/static:nonroot
WORKDIR /
COPY --from=builder /out/manager /manager
COPY --from=builder /out/hcp-sidecar /hcp-sidecar
USER 65532:65532
ENTRYPOINT ["/manager"]
