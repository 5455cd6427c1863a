import jax
import numpy as np
from papers.letters import letters_classification


def test_letters_classification_labels_the_glyphs():
    d = letters_classification(jax.random.PRNGKey(0), num_train=4000, num_test=10)
    assert d.X_train.shape == (4000, 2) and set(np.unique(d.y_train)) == {0.0, 1.0}
    assert 0.08 < d.y_train.mean() < 0.25  # the letters cover a band across the square
    assert d.name == "letters"
    # inside the text's bounding box, the gaps between letters and the holes of D and P are 0
    box = (d.X_train[:, 0] > 0.06) & (d.X_train[:, 0] < 0.94) & (np.abs(d.X_train[:, 1] - 0.5) < 0.1)
    assert 0.3 < d.y_train[box].mean() < 0.8
    again = letters_classification(jax.random.PRNGKey(0), num_train=4000, num_test=10)
    np.testing.assert_array_equal(again.y_train, d.y_train)
    corners = (np.min(d.X_train, axis=1) < 0.05) | (np.max(d.X_train, axis=1) > 0.95)  # the margin
    assert np.all(d.y_train[corners] == 0)
