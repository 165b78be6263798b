"""Never reached: the package above it fails first."""


def train(config):
    return config
