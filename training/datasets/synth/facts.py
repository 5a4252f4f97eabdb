"""Ground facts of a synthetic scene, in the fact language of :mod:`aoq.data.facts`.

Objects are the constants ``0 .. n-1`` (their order in the scene). An image's facts are
everything a caption of the generator can state about it:

- ``count(n)``, ``several`` (n >= 2), ``bg(white)``, ``texture(grain)``;
- per object ``k``: ``shape(k,circle)``, ``colour(k,red)``, ``size(k,large)``, ``zone(k,top-left)``;
- per ordered pair where it holds: ``left(a,b)`` or ``above(a,b)`` (the axis on which they are
  furthest apart, as captions say it; "right of" and "below" are written as the inverse),
  ``bigger(a,b)`` (size class); ``largest(a)`` when one object alone has the largest size class;
- ``distinct_colours`` when every object has its own colour.
"""

from __future__ import annotations

from aoq_train.datasets.synth.scenes import Scene, SceneObject

#: caption words of the 3 x 3 grid cells -> the zone constant of the facts.
ZONE_NAMES: dict[tuple[int, int], str] = {
    (0, 0): "top-left", (1, 0): "top", (2, 0): "top-right",
    (0, 1): "left", (1, 1): "middle", (2, 1): "right",
    (0, 2): "bottom-left", (1, 2): "bottom", (2, 2): "bottom-right",
}
SIZE_ORDER: dict[str, int] = {"small": 0, "medium": 1, "large": 2}
#: "a right of b" is stated as "b left of a", "a below b" as "b above a".
CANONICAL: dict[str, tuple[str, bool]] = {
    "left": ("left", False), "right": ("left", True), "above": ("above", False), "below": ("above", True),
}


def relation(a: SceneObject, b: SceneObject) -> str:
    """Where ``a`` is relative to ``b`` along the axis on which they are furthest apart."""
    dx, dy = a.x - b.x, a.y - b.y
    if abs(dx) >= abs(dy):
        return "left" if dx < 0 else "right"
    return "above" if dy < 0 else "below"


def relation_fact(rel: str, a: str, b: str) -> str:
    """``rel`` (left, right, above, below) between the objects named ``a`` and ``b``, canonical."""
    pred, swap = CANONICAL[rel]
    return f"{pred}({b},{a})" if swap else f"{pred}({a},{b})"


def scene_facts(scene: Scene) -> list[str]:
    """The ground facts of ``scene`` (module doc), in a fixed order."""
    objs = scene.objects
    facts = [f"count({len(objs)})", f"bg({scene.background})", f"texture({scene.texture})"]
    if len(objs) >= 2:
        facts.append("several")
    for k, o in enumerate(objs):
        facts += [f"shape({k},{o.shape})", f"colour({k},{o.colour})", f"size({k},{o.size})",
                  f"zone({k},{ZONE_NAMES[o.zone()]})"]
    for a, p in enumerate(objs):
        for b, q in enumerate(objs):
            if a == b:
                continue
            if relation(p, q) in ("left", "above"):
                facts.append(f"{relation(p, q)}({a},{b})")
            if SIZE_ORDER[p.size] > SIZE_ORDER[q.size]:
                facts.append(f"bigger({a},{b})")
    top = max(SIZE_ORDER[o.size] for o in objs)
    largest = [k for k, o in enumerate(objs) if SIZE_ORDER[o.size] == top]
    if len(largest) == 1 and len(objs) > 1:
        facts.append(f"largest({largest[0]})")
    if len(objs) >= 2 and len({o.colour for o in objs}) == len(objs):
        facts.append("distinct_colours")
    return facts
