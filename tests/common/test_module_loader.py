"""Tests of importing model-zoo modules by the name or path --model-def gives
(elastic_keras.common.module_loader)."""

import sys

import pytest

from elastic_keras.common.errors import ModelSpecError
from elastic_keras.common.module_loader import import_model_module
from tests.common.model_files import PARTS, module_source, unique, write, write_module

pytestmark = pytest.mark.usefixtures("restore_sys_path")


def test_a_named_model_function_of_a_package_module(tmp_path):
    pkg = unique("pkg")
    write(tmp_path / pkg / "__init__.py", "")
    write(tmp_path / pkg / "models.py", module_source(extra="def wide_model():\n    pass\n"))
    found = import_model_module(str(tmp_path), f"{pkg}.models.wide_model")
    assert (found.label, found.model_fn) == (f"{pkg}.models", "wide_model")
    assert found.module.__name__ == f"{pkg}.models"


def test_model_zoo_goes_first_on_sys_path(tmp_path):
    import_model_module(str(tmp_path), write_module(tmp_path))
    assert sys.path[0] == str(tmp_path.resolve())


def test_loads_a_package_module_with_relative_and_sibling_imports(tmp_path):
    pkg = unique("pkg")
    helpers = unique("helpers")
    write(tmp_path / pkg / "__init__.py", "")
    write(tmp_path / pkg / "shared.py", PARTS["loss"])
    write(tmp_path / f"{helpers}.py", PARTS["optimizer"].replace("keras.", "__import__('keras')."))
    write(
        tmp_path / pkg / "model.py",
        module_source(drop=("loss", "optimizer"))
        + f"from .shared import loss\nfrom {helpers} import optimizer\n",
    )
    found = import_model_module(str(tmp_path), f"{pkg}.model")
    assert found.label == f"{pkg}.model"
    assert found.module.loss.__module__ == f"{pkg}.shared"
    assert found.module.optimizer.__module__ == helpers


def test_a_model_function_of_a_top_level_module(tmp_path):
    name = write_module(tmp_path)
    found = import_model_module(str(tmp_path), f"{name}.custom_model")
    assert found.label == name
    assert found.model_fn == "custom_model"


def test_a_last_part_that_is_neither_module_nor_attribute(tmp_path):
    name = write_module(tmp_path)
    with pytest.raises(ModelSpecError, match=rf"'{name}.no_such_fn'.*no attribute `no_such_fn`"):
        import_model_module(str(tmp_path), f"{name}.no_such_fn")


def test_loads_a_py_file_by_path_with_sibling_imports(tmp_path):
    helpers = unique("helpers")
    write(tmp_path / "elsewhere" / f"{helpers}.py", PARTS["loss"])
    path = write(
        tmp_path / "elsewhere" / "my model.py",
        module_source(drop=("loss",)) + f"from {helpers} import loss\n",
    )
    found = import_model_module(str(tmp_path / "no-such-zoo"), str(path))
    assert found.label == str(path.resolve())
    assert found.module.loss.__module__ == helpers
    assert found.model_fn == "custom_model"


def test_a_relative_py_path_is_relative_to_the_model_zoo(tmp_path):
    write(tmp_path / "zoo" / "sub" / "m.py", module_source())
    found = import_model_module(str(tmp_path / "zoo"), "sub/m.py")
    assert found.label == str((tmp_path / "zoo" / "sub" / "m.py").resolve())


def test_a_py_file_inside_a_package_may_use_relative_imports(tmp_path):
    pkg = unique("pkg")
    write(tmp_path / pkg / "__init__.py", "")
    write(tmp_path / pkg / "shared.py", PARTS["loss"])
    path = write(
        tmp_path / pkg / "model.py",
        module_source(drop=("loss",)) + "from .shared import loss\n",
    )
    found = import_model_module(".", str(path))
    assert found.module.loss.__module__ == f"{pkg}.shared"


def test_a_py_file_in_a_package_that_has_no_dotted_name_loads_alone(tmp_path):
    write(tmp_path / "my-models" / "__init__.py", "")
    path = write(tmp_path / "my-models" / "model.py", module_source())
    found = import_model_module(".", str(path))
    assert found.label == str(path.resolve())


def test_a_missing_py_file(tmp_path):
    with pytest.raises(ModelSpecError, match=r"existing \.py file.*Received: model_def='gone\.py'"):
        import_model_module(str(tmp_path), "gone.py")


def test_a_second_zoo_with_the_same_module_name_wins(tmp_path):
    name = unique("model")
    write(tmp_path / "a" / f"{name}.py", module_source())
    write(tmp_path / "b" / f"{name}.py", module_source(extra="MARK = 'b'\n"))
    import_model_module(str(tmp_path / "a"), name)
    import_model_module(str(tmp_path / "b"), name)
    assert sys.modules[name].MARK == "b"


def test_a_module_that_fails_to_import(tmp_path):
    module = write_module(tmp_path, extra="undefined_name + 1\n")
    with pytest.raises(ModelSpecError) as info:
        import_model_module(str(tmp_path), module)
    message = str(info.value)
    assert f"Model module '{module}' must import without error" in message
    assert message.endswith("Received: NameError: name 'undefined_name' is not defined")
    assert isinstance(info.value.__cause__, NameError)
    assert module not in sys.modules


def test_a_module_whose_dependency_is_missing(tmp_path):
    module = write_module(tmp_path, extra="import no_such_dependency_xyz\n")
    with pytest.raises(ModelSpecError, match=r"must import without error.*no_such_dependency_xyz"):
        import_model_module(str(tmp_path), module)


def test_a_py_file_that_fails_to_import(tmp_path):
    path = write(tmp_path / "broken.py", "raise ValueError('bad module')\n")
    with pytest.raises(ModelSpecError, match=r"Received: ValueError: bad module$") as info:
        import_model_module(".", str(path))
    assert isinstance(info.value.__cause__, ValueError)


def test_a_model_zoo_that_does_not_exist(tmp_path):
    missing = tmp_path / "no_such_zoo"
    with pytest.raises(ModelSpecError) as info:
        import_model_module(str(missing), "mnist.mnist_functional")
    message = str(info.value)
    assert "--model-def 'mnist.mnist_functional'" in message
    assert f"Received: model_zoo='{missing}'" in message


@pytest.mark.parametrize("model_def", ["no_such_module", "no_such_pkg.module.fn"])
def test_a_module_not_found_under_the_model_zoo(tmp_path, model_def):
    with pytest.raises(ModelSpecError) as info:
        import_model_module(str(tmp_path), model_def)
    message = str(info.value)
    assert f"--model-def '{model_def}'" in message
    assert str(tmp_path.resolve()) in message


def test_a_submodule_not_found_in_an_existing_package(tmp_path):
    pkg = unique("pkg")
    write(tmp_path / pkg / "__init__.py", "")
    with pytest.raises(ModelSpecError) as info:
        import_model_module(str(tmp_path), f"{pkg}.missing.fn")
    assert f"--model-def '{pkg}.missing.fn' must name a module under" in str(info.value)
    assert f"module '{pkg}.missing' not found" in str(info.value)


@pytest.mark.parametrize("model_def", ["", "  ", "mnist..x", "1abc", "a-b"])
def test_a_malformed_model_def(tmp_path, model_def):
    with pytest.raises(ModelSpecError, match="--model-def must"):
        import_model_module(str(tmp_path), model_def)
