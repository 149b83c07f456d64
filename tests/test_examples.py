"""The examples in ``--smoke`` mode, run through their ``main(argv)`` in this test session's SparkSession,
and the data formats they read."""

import glob
import json
import os
import sys

import numpy as np
import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
sys.path.insert(0, EXAMPLES)

import batch_generate  # noqa: E402
import batch_inference  # noqa: E402
import cifar10_data  # noqa: E402
import example_support  # noqa: E402
import imagenet_resnet  # noqa: E402
import imagenet_records  # noqa: E402
import make_synthetic_imagenet  # noqa: E402
import ml_pipeline  # noqa: E402
import recommendation  # noqa: E402
import resnet_cifar  # noqa: E402
import streaming_ctr  # noqa: E402
import text_classifier  # noqa: E402
import tf_distribute_program  # noqa: E402


def test_cifar10_reader_reads_label_then_channel_planes(sc, tmp_path):
    # Two records built byte by byte: label, then the red, green and blue 32x32 planes.
    planes = np.arange(2 * 3 * 32 * 32).reshape(2, 3, 32, 32) % 251
    raw = b"".join(bytes([label]) + planes[i].astype(np.uint8).tobytes() for i, label in enumerate((7, 2)))
    for name in cifar10_data.TRAIN_FILES + cifar10_data.TEST_FILES:
        (tmp_path / name).write_bytes(raw)
    example_support.ship_helpers(sc)

    records = cifar10_data.read_rdd(sc, str(tmp_path), train=True).collect()
    assert len(records) == 10
    image, label = records[0]
    assert label == 7 and image.shape == (32, 32, 3) and image.dtype == np.uint8
    assert image[5, 9, 1] == planes[0, 1, 5, 9]  # row 5, column 9, green
    assert cifar10_data.read_rdd(sc, str(tmp_path), train=False).map(lambda r: r[1]).collect() == [7, 2]


def test_cifar10_writer_round_trips_and_a_missing_file_is_named(tmp_path):
    images, labels = cifar10_data.synthetic_arrays(5, seed=3)
    path = tmp_path / "data_batch_1.bin"
    cifar10_data.write_batch(str(path), images, labels)
    raw = path.read_bytes()
    assert len(raw) == 5 * cifar10_data.RECORD_BYTES
    image, label = cifar10_data.parse_record(raw[cifar10_data.RECORD_BYTES:2 * cifar10_data.RECORD_BYTES])
    assert label == labels[1]
    np.testing.assert_array_equal(image, images[1])
    with pytest.raises(FileNotFoundError, match="data_batch_2.bin"):
        cifar10_data.split_files(str(tmp_path), train=True)


@pytest.mark.parametrize("module", [resnet_cifar, imagenet_resnet, batch_inference, make_synthetic_imagenet,
                                    ml_pipeline, recommendation, tf_distribute_program, text_classifier,
                                    batch_generate, streaming_ctr])
def test_example_help_lists_its_flags(module, capsys):
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    assert "--smoke" in capsys.readouterr().out or module is make_synthetic_imagenet


def test_resnet_cifar_smoke_trains_validates_checkpoints_and_resumes(spark, tmp_path, capsys):
    model_dir = str(tmp_path / "model")
    first = resnet_cifar.main(["--smoke", "--model_dir", model_dir])
    out = capsys.readouterr().out
    assert f"accuracy={first['accuracy']:.4f} images/s=" in out
    assert first["epochs"] == 1 and first["iterations"] == 5 and first["resumed_from"] == 0
    assert first["images_per_sec"] > 0
    assert glob.glob(os.path.join(model_dir, "checkpoint-5.npz"))
    assert glob.glob(os.path.join(model_dir, "logs", "resnet_cifar", "train", "*tfevents*"))
    assert glob.glob(os.path.join(model_dir, "logs", "resnet_cifar", "validation", "*tfevents*"))

    again = resnet_cifar.main(["--smoke", "--model_dir", model_dir])
    assert "resumed from the checkpoint of iteration 5" in capsys.readouterr().out
    assert again["resumed_from"] == 5 and again["iterations"] == 5


def test_resnet_sizes_follow_the_cifar_recipe():
    assert len([layer for layer in resnet_cifar.build_resnet(20).layers if layer.__class__.__name__ == "Conv2D"]) == 21
    with pytest.raises(ValueError, match="6n"):
        resnet_cifar.build_resnet(21)


def test_synthetic_imagenet_records_have_the_imagenet_layout(tmp_path):
    import tensorflow as tf

    make_synthetic_imagenet.write_dataset(str(tmp_path), train_records=6, validation_records=2, num_classes=3,
                                          image_size=24, num_files=2)
    assert sorted(os.listdir(tmp_path)) == ["train-00000-of-00002", "train-00001-of-00002",
                                            "validation-00000-of-00002", "validation-00001-of-00002"]
    serialized = next(iter(tf.data.TFRecordDataset(str(tmp_path / "train-00000-of-00002"))))
    example = tf.train.Example.FromString(serialized.numpy())
    assert example.features.feature["image/encoded"].bytes_list.value[0][:2] == b"\xff\xd8"  # a JPEG
    image, label = imagenet_records.record_parser(imagenet_records.preprocess_for_evaluation, 16)(serialized)
    assert image.shape == (16, 16, 3) and image.dtype == tf.float32 and 0 <= int(label) < 3


def test_imagenet_training_preprocessing_draws_new_crops_and_evaluation_is_deterministic():
    import tensorflow as tf

    jpeg = tf.io.encode_jpeg(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8))
    first, *later = (imagenet_records.preprocess_for_training(jpeg, 24).numpy() for _ in range(3))
    assert first.shape == (24, 24, 3) and first.dtype == np.float32
    assert any(not np.array_equal(first, crop) for crop in later)  # two same crops and flips in a row can happen
    evaluated = imagenet_records.preprocess_for_evaluation(jpeg, 24)
    assert evaluated.shape == (24, 24, 3) and evaluated.dtype == tf.float32
    np.testing.assert_array_equal(evaluated.numpy(), imagenet_records.preprocess_for_evaluation(jpeg, 24).numpy())
    assert -2.5 < float(tf.reduce_min(evaluated)) < float(tf.reduce_max(evaluated)) < 3.0  # normalised


def test_imagenet_resnet_smoke_prints_images_per_second(spark, tmp_path, capsys):
    # one worker: the example's distributed path is resnet_cifar's (example_support), run on 2 workers and on a
    # standalone cluster; here ResNet-50's build and trace are paid once, not twice
    results = imagenet_resnet.main(["--smoke", "--num_workers", "1", "--model_dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "ResNet-50 at 32x32 on 8 images" in out
    assert f"| imagenet-resnet-50 | 1 Spark workers | {results['images_per_sec']:.1f} |" in out
    assert results["iterations"] == 2 and 0.0 <= results["accuracy"] <= 1.0
    assert glob.glob(os.path.join(str(tmp_path), "checkpoint-2.npz"))


def test_batch_inference_smoke_writes_parquet_and_counts_classes(spark, capsys):
    results = batch_inference.main(["--smoke"])
    scored = spark.read.parquet(results["output"])
    assert scored.columns == ["id", "features", "prediction"]
    assert results["rows"] == 200 and scored.count() == 200
    assert sum(results["class_counts"].values()) == 200
    assert set(results["class_counts"]) <= set(range(batch_inference.SMOKE_CLASSES))
    first = scored.orderBy("id").first()
    assert len(first["prediction"]) == batch_inference.SMOKE_CLASSES
    assert abs(sum(first["prediction"]) - 1.0) < 1e-4
    assert "records per predicted class" in capsys.readouterr().out


def test_ml_pipeline_smoke_tunes_saves_and_reloads_the_pipeline(spark, tmp_path, capsys):
    results = ml_pipeline.main(["--smoke", "--model_dir", str(tmp_path / "iris")])
    out = capsys.readouterr().out
    assert "epochs=1: cross-validated accuracy" in out and "epochs=3: cross-validated accuracy" in out
    assert results["best_epochs"] in (1, 3)
    assert results["reloaded_accuracy"] == pytest.approx(results["accuracy"])
    assert results["columns"][:5] == ml_pipeline.MEASURES + ["species"]
    stages = os.path.join(results["model_dir"], "stages")
    (keras_stage,) = [name for name in os.listdir(stages) if name.startswith("2_KerasModel")]
    assert os.path.isfile(os.path.join(stages, keras_stage, "model.keras"))


def test_streaming_ctr_smoke_trains_each_period_once_publishes_and_scores_the_stream(spark, capsys):
    results = streaming_ctr.main(["--smoke"])
    out = capsys.readouterr().out
    assert [entry["batchId"] for entry in results["progress"]] == [0, 1, 2, 3, 4]
    assert all("staging_seconds" in entry for entry in results["progress"])  # staged for the resident job
    assert results["progress"][-1]["version"] == 5 and results["scored"] == 5 * 600
    assert "test-then-train AUC" in out
    assert results["online_auc"] > 0.6, results  # a model that learned nothing scores 0.5


def test_recommendation_smoke_learns_clicks_and_ranks_each_users_top_10(spark, capsys):
    results = recommendation.main(["--smoke"])
    out = capsys.readouterr().out
    # the clicks follow a hidden affinity: a model that learned nothing scores 0.5 (0.70-0.78 over seeds 0-4)
    assert results["auc"] > 0.65, results["auc_per_epoch"]
    assert len(results["auc_per_epoch"]) == 2 and "held-out AUC after each epoch" in out
    assert results["class_weight"][1] > 5 * results["class_weight"][0]  # a few percent clicks
    users, items = results["users"], results["items"]
    by_user = {}
    for row in results["recommendations"]:
        by_user.setdefault(row["user"], []).append(row)
        assert users[row["user_id"]] == row["user"] and items[row["item_id"]] == row["item"]  # the strings map back
        assert row["user"].startswith("user_") and row["item"].startswith("item_")
    assert set(by_user) == set(results["candidate_counts"]) and len(by_user) == 20
    for user, rows in by_user.items():
        assert all(row["user_id"] < 20 for row in rows)  # the 20 most active users
        assert results["candidate_counts"][user] < len(items)  # less the items the user had in training
        assert len(rows) == min(recommendation.TOP_K, results["candidate_counts"][user])
        assert [row["rank"] for row in rows] == list(range(1, len(rows) + 1))
        scores = [row["score"] for row in rows]
        assert scores == sorted(scores, reverse=True) and all(0 < score < 1 for score in scores)
        assert len({row["item"] for row in rows}) == len(rows)
    for user in users[:3]:  # the lists printed, best first
        assert f"  {user}: {', '.join(row['item'] for row in by_user[user])}\n" in out


def test_tf_distribute_program_smoke_trains_in_two_processes_and_the_chief_saves(sc, tmp_path, capfd):
    model_dir = tmp_path / "model"
    result = tf_distribute_program.main(["--smoke", "--model_dir", str(model_dir)])
    output = "".join(capfd.readouterr())
    assert "[chief 0] epoch 2/2 loss" in output and "[worker 0] epoch 2/2 loss" in output
    assert result["model_path"] == str(model_dir / "model.keras") and result["loss"] > 0
    assert (model_dir / "model.keras").stat().st_size > 0
    assert f"chief returned: {json.dumps(result)}" in output


def test_keras_hub_examples_smoke_fine_tune_evaluate_score_and_generate(spark, capsys):
    classified = text_classifier.main(["--smoke", "--num_workers", "1"])  # 2 workers: test_keras_hub, exactly
    out = capsys.readouterr().out
    # one keyword decides the label: 1.0 held out after 4 epochs (0.5 for a model that learned nothing)
    assert classified["accuracy"] > 0.9, classified["loss_per_epoch"]
    assert f"held-out accuracy={classified['accuracy']:.4f}" in out
    assert len(classified["loss_per_epoch"]) == 4
    # predict_dataframe's logits on the held-out rows agree with evaluate's accuracy on the same rows
    assert classified["scored_accuracy"] == pytest.approx(classified["accuracy"], abs=1e-6)
    assert len(classified["examples"]) == 5
    for row in classified["examples"]:
        assert 0.0 < row["positive"] < 1.0 and f"P(positive)={row['positive']:.3f} label={row['label']}" in out

    generated = batch_generate.main(["--smoke", "--num_workers", "1"])
    out = capsys.readouterr().out
    completions = generated["completions"]
    assert [row[0] for row in completions] == list(range(12))  # every prompt, in the DataFrame's order
    assert "12 completions" in out
    for _, prompt, completion in completions:
        assert isinstance(completion, str) and completion.startswith(prompt)
        assert len(completion.split()) <= len(prompt.split()) + 6  # max_new_tokens 6 (one letter is one token)
    assert generated["correct_share"] > 0.5, completions  # the runs are learned: 1.0 after 3 epochs
