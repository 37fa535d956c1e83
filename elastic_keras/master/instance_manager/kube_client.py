"""The official Kubernetes client, configured the standard way.

In a cluster (`KUBERNETES_SERVICE_HOST` set) and with no kubeconfig named, the pod's service
account; otherwise the kubeconfig file: `--kubeconfig`, else `$KUBECONFIG`, else
`~/.kube/config`. The client is an optional dependency (`pip install
"elastic-keras[kubernetes]"`).
"""

import os

from elastic_keras.common.errors import ConfigError

INSTALL_HINT = 'pip install "elastic-keras[kubernetes]"'


def core_api(kubeconfig=""):
    """A `CoreV1Api` with its own connection pool.

    Raises:
        ConfigError: the client is not installed, or no configuration can be loaded.
    """
    try:
        from kubernetes import client, config
    except ImportError as exc:
        raise ConfigError(f"--engine kubernetes needs the kubernetes client: {INSTALL_HINT}. "
                          "Received: it is not installed") from exc
    try:
        if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.CoreV1Api(client.ApiClient(configuration))
        path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        return client.CoreV1Api(config.new_client_from_config(
            config_file=os.path.expanduser(path.split(os.pathsep)[0])))
    except (config.ConfigException, OSError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ConfigError(f"Cannot configure the Kubernetes client: not in a cluster, and "
                          f"the kubeconfig {where} cannot be used: {exc}") from exc


def api_exception():
    """The client's `ApiException` class."""
    from kubernetes.client.exceptions import ApiException
    return ApiException
