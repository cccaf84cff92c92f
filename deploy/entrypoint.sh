#!/bin/sh
# The container's entry point (deploy/Dockerfile). With arguments, they are `modelyard serve`'s
# (the Kubernetes Deployment passes --config ...). With none:
#   a config mounted at $MODELYARD_CONFIG (/etc/modelyard/config.yaml) -> serve it, watched
#   else GGUF files under $MODELYARD_MODELS (/models)                  -> serve the folder, watched
#   else                                                               -> the default model
# always on 0.0.0.0:8080. Without a config the admin routes are closed (no key guards them).
set -eu
config=${MODELYARD_CONFIG:-/etc/modelyard/config.yaml}
models=${MODELYARD_MODELS:-/models}
if [ "$#" -gt 0 ]; then
    exec modelyard serve "$@"
fi
if [ -f "$config" ]; then
    exec modelyard serve --config "$config" --host 0.0.0.0 --port 8080
fi
if [ -d "$models" ] && [ -n "$(find "$models" -name '*.gguf' -print | head -n 1)" ]; then
    exec modelyard serve --models-dir "$models" --host 0.0.0.0 --port 8080
fi
echo "modelyard: no config at $config and no GGUF file under $models: serving the default model" >&2
exec modelyard serve --host 0.0.0.0 --port 8080
