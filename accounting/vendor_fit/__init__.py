"""HAMi's per-device fit, written out for the devices the generic path does not cover.

Layer: accounting (pure). ``accounting.fit`` places most pods with its generic loop (memory,
cores, slots). A vendor whose entry in the vendor table names a rule, an NVIDIA node with a
card in MIG mode, or a pod whose GPU policy names topology-aware (its NVIDIA cards), is placed
here instead, by a readable copy of HAMi's ``Fit`` walk
(``pkg/device/<vendor>/device.go``) with each vendor's own steps:

* the walk visits the vendor's devices in the fit's order and counts, per device visited, the
  first reason that stops it: ``CardNotHealth``, ``CardCordoned`` (NVIDIA),
  ``CardTypeMismatch`` (another model or sharing mode by the pod's annotations),
  ``CardUuidMismatch``, ``ExclusiveDeviceAllocateConflict`` (a used device where the vendor takes
  devices whole), ``CardTimeSlicingExhausted``, ``CardInsufficientMemory``,
  ``CardInsufficientCore``, ``ExclusiveDeviceAllocateConflict`` (every core asked of a used
  card), ``CardComputeUnitsExhausted``, then the vendor's own: ``CardMigTopologyInfeasible``,
  ``CardNotFoundCustomFilterRule``; too few devices passing is
  ``AllocatedCardsInsufficientRequest`` (counting those that did);
* **MIG** (NVIDIA, a card in ``mig`` mode): the request is fitted to an instance of the card's
  profiles (``accounting.mig.choose_instance``) and charged the instance; a container asking
  for several devices may get several instances of one card (HAMi visits a MIG card again);
* **whole devices** (Metax GPU, Enflame GCU, Kunlun, Vastai, Biren) and **one device per pod**
  (Metax GPU, Moore Threads); **compute units** (AMD: percent asked, CUs charged);
* **topology-aware** (NVIDIA, a pod whose GPU policy names it): every card that passes is
  collected, then the node's pair scores choose among them (``topology``);
* **Ascend**: the hami-core gate (``ModeNotFit`` once for the node), NetworkID groups and 910C
  modules of two NPUs;
* vendors whose HAMi rule is not modelled here refuse the node with
  ``VendorRuleNotModelled``, naming the rule, instead of being fitted by a rule that is not
  theirs.

The passes are the fit's (``accounting.fit``): steady containers charge the node copy in order,
each regular init container is checked against it as it stands at its point and charges
nothing; a container's own grants are charged once its walk is done, as HAMi's do.

The package: ``walk`` (the walk and the node's refusals), the vendors' own steps beside it
(``ascend``, ``enflame_drs``, ``kunlun_walk``, ``metax``, ``neuron``, ``topology``), over
``cards`` (the cards and the steps every vendor takes on one).
"""

from accounting.vendor_fit.ascend import network_term
from accounting.vendor_fit.cards import (
    WHOLE_CARD_CORES,
    DrsProfile,
    Pick,
    RuleContext,
    RuleFailure,
    Score,
)
from accounting.vendor_fit.enflame_drs import drs_profile
from accounting.vendor_fit.walk import NOT_MODELLED_RULES, needs_rules, place

__all__ = [
    "NOT_MODELLED_RULES",
    "WHOLE_CARD_CORES",
    "DrsProfile",
    "Pick",
    "RuleContext",
    "RuleFailure",
    "Score",
    "drs_profile",
    "needs_rules",
    "network_term",
    "place",
]
