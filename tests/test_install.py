"""One TensorFlow per environment: what setup.cfg asks for and what is installed."""

import configparser
import importlib.metadata
import os
import re

from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECREATE = "recreate the environment: make clean && make test"


def tensorflow_owners():
    """Names of the installed distributions that write the top-level ``tensorflow`` package."""
    owners = set()
    for dist in importlib.metadata.distributions():
        top_level = dist.read_text("top_level.txt")
        if top_level is not None:
            writes = "tensorflow" in top_level.split()
        else:
            writes = any(file.parts[:2] == ("tensorflow", "__init__.py") for file in dist.files or ())
        if writes:
            owners.add(canonical(dist.metadata["Name"]))
    return owners


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def test_exactly_one_tensorflow_distribution_is_installed():
    owners = tensorflow_owners()
    assert len(owners) == 1, (f"{sorted(owners)} all write the tensorflow package directory, over each other; "
                              f"{RECREATE}")


def test_tf_keras_requirement_is_met_by_the_installed_tensorflow():
    try:
        requirements = importlib.metadata.requires("tf-keras") or []
    except importlib.metadata.PackageNotFoundError:
        return
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is None and canonical(requirement.name).startswith("tensorflow"):
            assert tensorflow_owners() == {canonical(requirement.name)}, (text, RECREATE)
            version = importlib.metadata.version(requirement.name)
            assert requirement.specifier.contains(version, prereleases=True), (text, version, RECREATE)


def test_setup_cfg_names_one_tensorflow_distribution():
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    def tensorflows(section, key):  # distributions that write site-packages/tensorflow (not tensorflow-text's add-on)
        names = {canonical(Requirement(line).name) for line in config[section][key].splitlines() if line.strip()}
        return {name for name in names if name.startswith(("tensorflow", "tf-nightly")) and name != "tensorflow-text"}

    assert tensorflows("options", "install_requires") == {"tensorflow"}  # a plain pip install sparktf works
    for extra in config["options.extras_require"]:
        assert tensorflows("options.extras_require", extra) <= {"tensorflow"}, extra
