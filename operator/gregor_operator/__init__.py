"""The Gregor operator: `KafkaCluster`, `Topic` and `User` resources (group `gregor.dev`,
version `v1alpha1`) turned into running broker pods and topics.

`models` holds the resources' pydantic models, the one source of truth from which `crds`
generates the CustomResourceDefinitions in `crds/`.
"""

GROUP = "gregor.dev"
VERSION = "v1alpha1"
