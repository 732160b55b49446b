# The pod sandbox: Kubernetes' pause.c, built static here, and nothing else.
FROM scratch
COPY bin/pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
