"""The environment a local Ray cluster serves with (`dlm serve`, the served tests, the soak). Every Ray process reads
it when it starts, so it is set before `ray.init` starts the cluster; k8s/rayservice.yaml sets the same on its pods.
Measured with `dlm bench --target ... --concurrency 1,16` on the shipped zoo, 2 cores, back to back."""

import os

RAY_ENV = {
    # Ray starts its workers at nice 15, below the clients of a local run: c=1 rounds took 80 ms against 60 at nice 0
    "RAY_worker_niceness": "0",
    # Serve's throughput-optimized mode: handle calls between deployments over gRPC, and routers and user code on each
    # replica's own event loop instead of threads of their own. Steady state, 8 requests per stream: c=1 rounds 64 ms
    # against 85, c=16 574 tok/s against 458 (gRPC calls alone: 69 ms, 515 tok/s)
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    # but not its direct ingress: the OpenAI API stays on Serve's proxy at serving.http_port
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0",
}


def set_ray_env() -> None:
    """RAY_ENV, where the environment does not say otherwise."""
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
