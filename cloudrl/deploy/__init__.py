"""Deploying cloudrl on Kubernetes with KubeRay: the manifests in ``deploy/kubernetes/``,
rendered and checked here without a cluster.

* :mod:`cloudrl.deploy.kustomize`: a small kustomize renderer (the subset the manifests use).
* :mod:`cloudrl.deploy.crd_schema`: a CustomResourceDefinition's openAPIV3Schema as JSON
  Schema (how ``deploy/kubernetes/schemas/`` was made from KubeRay's CRDs).
* :mod:`cloudrl.deploy.validate`: built-in kinds against the Kubernetes schemas
  (``kubernetes-validate``), KubeRay resources against the vendored CRD schemas.
* :mod:`cloudrl.deploy.serve_config`: the RayService's ``serveConfigV2``, generated from
  the decision service's own Serve config (``serve_apps/config.yaml``).
* :mod:`cloudrl.deploy.cli`: ``cloudrl deploy render``, ``check`` and
  ``render-serve-config``.
"""
